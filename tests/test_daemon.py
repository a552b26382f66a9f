"""End to end with real processes: the toy trainer writes checkpoints, ``evald run`` evaluates them in
worker processes, and the database is checked for exactly-once results."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from inference.metrics import DEFAULT_METRICS
from storage import queries
from storage.database import Database
from storage.models import EvalJob
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.deadlines import Deadline, wait_process
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    checkpoints,
    jobs,
    no_worker_left,
    running_daemon,
    start_trainer,
    upgraded,
    wait_for,
    worker_processes,
    write_config,
    write_dataset,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "arith.jsonl", 20)


@pytest.fixture
def trained(toy_run: ToyRun) -> Path:
    """A real toy checkpoint (from the session's trainer run) to copy into run folders."""
    return toy_run.last_checkpoint


def _result_counts(database: Database) -> Counter[tuple[str, str, str]]:
    with database.session() as session:
        return Counter((r.checkpoint, r.task, r.metric) for r in queries.result_rows(session))


def test_every_checkpoint_is_evaluated_exactly_once_after_it_is_complete(
    database_url: str, dataset: Path, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=dataset)
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        trainer = start_trainer(
            tmp_path / "run",
            tmp_path / "trainer.log",
            # Three saves are what the test needs, not learning: each step is trainer CPU (57 of them were
            # 5 s of it), the saves and the pauses between them are the point.
            "--steps",
            "6",
            "--save-every",
            "2",
            "--sleep-between-saves",
            "0.5",
        )
        assert wait_process(trainer, 300) == 0
        saved = sorted(p for p in (tmp_path / "run").iterdir() if p.is_dir())
        assert [p.name for p in saved] == ["step_2", "step_4", "step_6"]
        rows = wait_for(lambda: all_jobs_done(database, 3), 180, "three finished jobs", daemon.process)
        assert daemon.stop() == 0
    assert [(j.step, j.state, j.attempts) for j in rows] == [
        (2, "succeeded", 1),
        (4, "succeeded", 1),
        (6, "succeeded", 1),
    ]
    counts = _result_counts(database)
    metrics = {"accuracy", "response_length", "truncation_rate", "tokens_per_s", "wall_s"}
    assert set(counts) == {(p.name, "arith", m) for p in saved for m in metrics}
    assert set(counts.values()) == {1}
    # None was read before it was complete: each job started after its checkpoint's last write.
    with database.session() as session:
        started = {j.checkpoint.name: j.started_at for j in session.scalars(select(EvalJob)).all()}
    for path in saved:
        last_write = max(f.stat().st_mtime for f in path.iterdir())
        began = started[path.name]
        assert began is not None and began.timestamp() >= last_write, path.name
    database.dispose()


def test_broken_checkpoints_fail_clearly_and_the_next_good_one_is_evaluated(
    sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=dataset, invalid_after=2.0)
    root = tmp_path / "run"

    def truncate(path: Path) -> None:
        os.truncate(path / "model.safetensors", (path / "model.safetensors").stat().st_size - 64)

    def bad_json(path: Path) -> None:
        (path / "config.json").write_text('{"model_type": "llama",')

    def unknown_model(path: Path) -> None:
        (path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))

    def missing_index_shard(path: Path) -> None:
        (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
        weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": weight_map})
        )

    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        copy_checkpoint(trained, root / "step_1", truncate)
        copy_checkpoint(trained, root / "step_2", bad_json)
        copy_checkpoint(trained, root / "step_3", unknown_model)
        copy_checkpoint(trained, root / "step_4", missing_index_shard)
        copy_checkpoint(trained, root / "step_5")

        def settled() -> list[queries.CheckpointRow] | None:
            rows = checkpoints(database)
            done = all_jobs_done(database, 2)
            return rows if done and len(rows) == 5 and all(r.state != "discovered" for r in rows) else None

        rows = wait_for(settled, 120, "all five checkpoints settled", daemon.process)
        assert daemon.stop() == 0
    by_name = {r.name: r for r in rows}
    assert by_name["step_1"].state == "invalid"
    assert "model.safetensors: truncated" in (by_name["step_1"].reason or "")
    assert by_name["step_2"].state == "invalid"
    assert (by_name["step_2"].reason or "").startswith("config.json is not valid JSON")
    assert by_name["step_4"].state == "invalid"
    assert "model-00002-of-00002.safetensors named in model.safetensors.index.json is missing" in (
        by_name["step_4"].reason or ""
    )
    job_by_step = {j.step: j for j in jobs(database)}
    assert set(job_by_step) == {3, 5}
    assert job_by_step[3].state == "failed"
    assert (job_by_step[3].error or "").startswith(f"{root / 'step_3'}: cannot load the model")
    assert "no-such-architecture" in (job_by_step[3].error or "")
    assert job_by_step[5].state == "succeeded"
    database.dispose()


def test_sigkill_mid_job_redoes_it_once_and_evaluates_nothing_twice(
    sqlite_url: str, trained: Path, tmp_path: Path
) -> None:
    big = write_dataset(tmp_path / "big.jsonl", 400)
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=big, batch_size=4)
    root = tmp_path / "run"
    for step in (10, 20):
        copy_checkpoint(trained, root / f"step_{step}")
    first = DaemonProcess(config, tmp_path / "daemon-1.log")
    first.wait_ready()
    running = wait_for(
        lambda: [j for j in jobs(database) if j.state == "running"] or None,
        60,
        "a running job",
        first.process,
    )
    # Past its start (tied to the daemon, evaluating), then stopped, so that the job is still running when
    # its daemon is killed: a toy job can end within a second. A stopped process still dies of SIGKILL.
    wait_for(
        lambda: any(
            b'"worker.started"' in p.read_bytes() for p in (tmp_path / "state").glob("jobs/*/worker.log")
        ),
        30,
        "the worker's start",
    )
    workers = wait_for(lambda: worker_processes(tmp_path / "state") or None, 30, "the worker process")
    for worker in workers:
        worker.suspend()
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    # The worker dies with its daemon instead of running on unobserved.
    wait_for(lambda: not worker_processes(tmp_path / "state"), 20, "the orphaned worker to die")
    assert jobs(database)[-1].state in ("running", "pending")

    with running_daemon(config, tmp_path / "daemon-2.log") as second:
        rows = wait_for(lambda: all_jobs_done(database, 2), 300, "both jobs finished", second.process)
        assert second.stop() == 0
    attempts = {j.id: j.attempts for j in rows}
    assert all(j.state == "succeeded" for j in rows)
    assert attempts[running[0].id] == 2
    assert sorted(attempts.values()) == [1, 2]
    counts = _result_counts(database)
    assert len(counts) == 2 * len(DEFAULT_METRICS["generate"]) and set(counts.values()) == {1}
    assert b"job.recovered" in (tmp_path / "daemon-2.log").read_bytes()
    database.dispose()


def test_sigterm_requeues_the_running_job_and_exits_cleanly(
    sqlite_url: str, trained: Path, tmp_path: Path
) -> None:
    big = write_dataset(tmp_path / "big.jsonl", 400)
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=big, batch_size=4, grace=0.0)
    copy_checkpoint(trained, tmp_path / "run" / "step_10")
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        wait_for(
            lambda: [j for j in jobs(database) if j.state == "running"] or None,
            60,
            "a running job",
            daemon.process,
        )
        wait_for(lambda: worker_processes(tmp_path / "state") or None, 30, "the worker process")
        bound = Deadline(15)
        assert daemon.stop(signal.SIGTERM) == 0
        # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
        assert not bound.expired(), f"took {bound.waited():.1f} s"
    [job] = jobs(database)
    assert (job.state, job.attempts) == ("pending", 0)
    no_worker_left(tmp_path / "state")
    assert b"job.requeued" in (tmp_path / "daemon.log").read_bytes()
    database.dispose()


def test_systemd_notify_ready_and_watchdog(sqlite_url: str, dataset: Path, tmp_path: Path) -> None:
    upgraded(sqlite_url).dispose()
    config = write_config(tmp_path, sqlite_url, dataset=dataset)
    address = str(tmp_path / "notify.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(address)
    receiver.settimeout(30)
    env = {"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "200000"}
    daemon = DaemonProcess(config, tmp_path / "daemon.log", env=env)
    try:
        messages = []
        while "WATCHDOG=1" not in messages:
            messages.append(receiver.recv(256).decode())
        assert messages.index("READY=1") < messages.index("WATCHDOG=1")
        assert daemon.stop() == 0
        receiver.settimeout(1)
        with contextlib.suppress(TimeoutError):
            while True:
                messages.append(receiver.recv(256).decode())
        assert messages[-1] == "STOPPING=1"
    finally:
        receiver.close()
        if daemon.process.poll() is None:
            daemon.process.kill()


def test_logs_are_json_lines_with_stable_event_names(sqlite_url: str, dataset: Path, tmp_path: Path) -> None:
    upgraded(sqlite_url).dispose()
    config = write_config(tmp_path, sqlite_url, dataset=dataset)
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        assert daemon.stop() == 0
    events = [json.loads(line) for line in (tmp_path / "daemon.log").read_text().splitlines()]
    names = [e["event"] for e in events]
    assert names[-1] == "daemon.stopped" and "daemon.ready" in names and "daemon.stopping" in names
    assert all(datetime.fromisoformat(e["timestamp"]).tzinfo == UTC for e in events)


@pytest.mark.long
def test_rotated_checkpoints_end_as_vanished_and_the_daemon_goes_on(
    sqlite_url: str, trained: Path, tmp_path: Path
) -> None:
    big = write_dataset(tmp_path / "big.jsonl", 300)
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=big, batch_size=4)
    root = tmp_path / "run"
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        copy_checkpoint(trained, root / "step_10")
        copy_checkpoint(trained, root / "step_20")
        # One job runs (max_concurrent = 1) while the other waits.
        [running] = wait_for(
            lambda: [j for j in jobs(database) if j.state == "running"] or None,
            60,
            "a running job",
            daemon.process,
        )
        waiting = 10 if running.step == 20 else 20
        log = tmp_path / "state" / "jobs" / f"{running.id}-1" / "worker.log"
        wait_for(lambda: log.exists() and b"task.loaded" in log.read_bytes(), 60, "the model loaded")
        shutil.rmtree(root / f"step_{running.step}")  # rotated while being evaluated
        shutil.rmtree(root / f"step_{waiting}")  # rotated before its worker starts
        copy_checkpoint(trained, root / "step_30")
        rows = wait_for(lambda: all_jobs_done(database, 3), 180, "three finished jobs", daemon.process)
        assert daemon.stop() == 0
    by_step = {j.step: j for j in rows}
    assert by_step[running.step].state == "succeeded"  # it had the whole model in memory
    assert by_step[waiting].state == "failed" and "does not exist" in (by_step[waiting].error or "")
    assert by_step[30].state == "succeeded"
    states = {c.name: (c.state, c.reason) for c in checkpoints(database)}
    assert states[f"step_{running.step}"] == ("vanished", "deleted after it was evaluated")
    assert states[f"step_{waiting}"][0] == "vanished"
    assert states["step_30"][0] == "ready"
    with database.session() as session:
        kinds = dict(session.execute(select(EvalJob.step, EvalJob.error_kind)).all())
    assert kinds[waiting] == "checkpoint_vanished"
    database.dispose()
