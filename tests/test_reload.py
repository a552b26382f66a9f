"""``systemctl reload`` (SIGHUP): the daemon reads its config again without dropping the running job, and
keeps the old config when the new one is bad."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from storage import queries
from storage.database import Database
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import DaemonProcess, jobs, log_events, upgraded, wait_for, write_config, write_dataset

pytestmark = pytest.mark.slow


def test_sighup_adds_a_run_keeps_the_running_job_and_refuses_a_bad_config(
    sqlite_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    data = write_dataset(tmp_path / "arith.jsonl", 24)
    config = write_config(tmp_path, sqlite_url, dataset=data, batch_size=2)
    original = config.read_text()
    other_root = tmp_path / "other"
    other_root.mkdir()
    log = tmp_path / "daemon.log"
    daemon = DaemonProcess(config, log)
    try:
        daemon.wait_ready()
        copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
        running = wait_for(
            lambda: [j for j in jobs(database) if j.state == "running"] or None, 60, "a running job"
        )
        # A second run, and a changed threshold, while the first run's job is running.
        added = original.replace(
            "[[tasks]]", f'[[runs]]\nname = "other"\nroot = "{other_root}"\n\n[[tasks]]', 1
        ).replace("rescan_secs = 2.0", "rescan_secs = 3.0")
        config.write_text(added)
        daemon.process.send_signal(signal.SIGHUP)
        reloaded = wait_for(
            lambda: log_events(log, "config.reloaded") or None, 30, "config.reloaded", daemon.process
        )
        assert reloaded[0]["runs"] == ["toy", "other"]
        assert reloaded[0]["running_jobs"] == [running[0].id]
        copy_checkpoint(toy_run.last_checkpoint, other_root / "step_20")
        rows = wait_for(lambda: _all_succeeded(database, 2), 180, "both runs' jobs", daemon.process)
        # The job that ran through the reload finished on its first attempt.
        assert {(j.run, j.step, j.attempts) for j in rows} == {("toy", 10, 1), ("other", 20, 1)}

        # A config that does not validate is refused with its reasons; the daemon goes on with the old.
        config.write_text(added.replace("batch_size = 2", "batch_size = -1"))
        daemon.process.send_signal(signal.SIGHUP)
        refused = wait_for(
            lambda: log_events(log, "config.reload_refused") or None,
            30,
            "config.reload_refused",
            daemon.process,
        )
        assert any("batch_size" in str(p) for p in refused[0]["problems"])
        # A database change needs a restart: refused, naming the field.
        config.write_text(added.replace(sqlite_url, f"sqlite:///{tmp_path / 'elsewhere.db'}"))
        daemon.process.send_signal(signal.SIGHUP)
        refused = wait_for(
            lambda: e if len(e := log_events(log, "config.reload_refused")) == 2 else None,
            30,
            "the second refusal",
            daemon.process,
        )
        assert any("database.url" in str(p) for p in refused[1]["problems"])
        # Still the old config: the other run is still watched and evaluated.
        copy_checkpoint(toy_run.last_checkpoint, other_root / "step_30")
        wait_for(
            lambda: [j for j in jobs(database) if j.step == 30 and j.state == "succeeded"] or None,
            180,
            "step 30 of the other run",
            daemon.process,
        )
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
    database.dispose()


def _all_succeeded(database: Database, count: int) -> list[queries.JobRow] | None:
    rows = jobs(database)
    return rows if len(rows) == count and all(j.state == "succeeded" for j in rows) else None


def test_a_reload_refused_names_the_config_file_it_read(sqlite_url: str, tmp_path: Path) -> None:
    upgraded(sqlite_url).dispose()
    config = write_config(tmp_path, sqlite_url, dataset=write_dataset(tmp_path / "arith.jsonl", 2))
    original = config.read_text()
    log = tmp_path / "daemon.log"
    daemon = DaemonProcess(config, log)
    try:
        daemon.wait_ready()
        config.unlink()  # deleted, or moved by a deploy that has not put the new one in place yet
        daemon.process.send_signal(signal.SIGHUP)
        [refused] = wait_for(
            lambda: log_events(log, "config.reload_refused") or None,
            30,
            "config.reload_refused",
            daemon.process,
        )
        assert refused["problems"] == [
            f"{config}: file not found (the daemon started with it: put it back and reload)"
        ]
        config.write_text(original.replace("batch_size = 16", "batch_size = -1"))
        daemon.process.send_signal(signal.SIGHUP)
        second = wait_for(
            lambda: e if len(e := log_events(log, "config.reload_refused")) == 2 else None,
            30,
            "the second refusal",
            daemon.process,
        )
        problems = second[1]["problems"]
        assert isinstance(problems, list) and problems[0].startswith(f"{config}: tasks[0].batch_size: ")
        config.write_text(original)
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda: log_events(log, "config.reloaded") or None, 30, "config.reloaded", daemon.process)
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
