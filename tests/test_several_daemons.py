"""Several daemons on one PostgreSQL database: they start together without tripping over each other,
share the queue (each job runs once), say who holds what, and take over a dead one's job after its lease.
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from sqlalchemy import select

from daemon.config import load_config
from daemon.service import register_runs
from storage import queries
from storage.database import Database
from storage.models import JobAttempt
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    evald,
    jobs,
    upgraded,
    wait_for,
    worker_processes,
    write_config,
    write_dataset,
)

pytestmark = pytest.mark.postgres

LEASE_SECS = 4.0
#: A short lease and a quick orphan check, so the takeover is measured in seconds.
SHARED = "recover_secs = 1.0\n"


def _config(tmp: Path, url: str, name: str, root: Path, data: Path) -> Path:
    folder = tmp / name
    folder.mkdir()
    path = write_config(folder, url, dataset=data, batch_size=4)
    # Both daemons watch the same run root; each keeps its own state folder.
    text = path.read_text().replace(f'root = "{folder / "run"}"', f'root = "{root}"')
    text = text.replace("lease_secs = 5.0", f"lease_secs = {LEASE_SECS}\n{SHARED}")
    path.write_text(text)
    return path


def test_runs_registered_by_many_daemons_at_once_never_collide(postgres_url: str, tmp_path: Path) -> None:
    upgraded(postgres_url).dispose()
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    config = load_config(write_config(tmp_path, postgres_url, dataset=data))
    databases = [Database(postgres_url) for _ in range(6)]
    failures: list[BaseException] = []
    ids: list[int] = []
    for round_ in range(15):
        fresh = config.model_copy(
            update={"runs": [r.model_copy(update={"name": f"{r.name}-{round_}"}) for r in config.runs]}
        )
        barrier = threading.Barrier(len(databases))

        def start(database: Database, run_config=fresh, gate=barrier) -> None:  # type: ignore[no-untyped-def]
            gate.wait()
            try:
                ids.extend(w.run_id for w in register_runs(run_config, database))
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=start, args=(db,)) for db in databases]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for database in databases:
        database.dispose()
    assert failures == []
    # Six daemons a round, one run each: every daemon got the one id of its round's run.
    assert len(ids) == 15 * 6 and len(set(ids)) == 15


def _holder(database: Database) -> tuple[int, str] | None:
    running = [j for j in jobs(database) if j.state == "running" and j.claimed_by]
    return (running[0].id, running[0].claimed_by or "") if running else None


def _held_by_another(database: Database, owner: str) -> tuple[int, str] | None:
    held = _holder(database)
    return held if held is not None and held[1] != owner else None


def _all_succeeded(database: Database, count: int) -> list[queries.JobRow] | None:
    rows = jobs(database)
    return rows if len(rows) == count and all(j.state == "succeeded" for j in rows) else None


@pytest.mark.long
@pytest.mark.slow
def test_two_daemons_share_the_queue_and_take_over_a_killed_ones_job(
    postgres_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(postgres_url)
    data = write_dataset(tmp_path / "arith.jsonl", 16)
    root = tmp_path / "run"
    root.mkdir()
    configs = [_config(tmp_path, postgres_url, name, root, data) for name in ("a", "b")]
    daemons = [DaemonProcess(c, c.parent / "daemon.log", fresh=True) for c in configs]
    try:
        for daemon in daemons:
            daemon.wait_ready()
        copy_checkpoint(toy_run.last_checkpoint, root / "step_10")
        job_id, owner = wait_for(lambda: _holder(database), 60, "a claimed job")
        by_pid = {str(d.process.pid): d for d in daemons}
        holder = by_pid[owner.rsplit(":", 1)[1]]
        other = next(d for d in daemons if d is not holder)
        # The holder's worker is stopped (SIGSTOP), so the job is still running when the holder is
        # killed below: a toy job can otherwise end between two `evald status` calls on a quiet machine.
        held = configs[daemons.index(holder)].parent / "state"
        stopped = wait_for(lambda: worker_processes(held) or None, 60, "the holder's worker")
        for process in stopped:
            process.suspend()
        # `evald status` names the daemon that holds it.
        status = evald("--config", str(configs[0]), "status", "--format", "json")
        assert status.returncode == 0, status.stderr
        running = json.loads(status.stdout)["runs"]["toy"]["running"]
        assert [(r["job"], r["held_by"]) for r in running] == [(job_id, owner)]
        text = evald("--config", str(configs[0]), "status").stdout
        assert f"on {owner}" in text
        holder.stop(signal.SIGKILL)
        killed = time.monotonic()
        # Going on, the orphaned worker sees its daemon gone and leaves, as one not stopped would have.
        for process in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.resume()
        taken = wait_for(
            lambda: _held_by_another(database, owner), LEASE_SECS + 30, "the takeover", other.process
        )
        takeover = time.monotonic() - killed
        assert taken[0] == job_id
        assert takeover <= LEASE_SECS + 10, f"taken over after {takeover:.1f} s"
        # More checkpoints: the survivor evaluates them, each once.
        for step in (20, 30):
            copy_checkpoint(toy_run.last_checkpoint, root / f"step_{step}")
        rows = wait_for(lambda: _all_succeeded(database, 3), 240, "three succeeded jobs", other.process)
        assert other.stop() == 0
    finally:
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.process.kill()
    attempts = {j.step: j.attempts for j in rows}
    assert attempts == {10: 2, 20: 1, 30: 1}
    with database.session() as session:
        outcomes = Counter((a.job_id, a.outcome) for a in session.scalars(select(JobAttempt)))
    # Each job succeeded exactly once; the killed daemon's attempt left no result behind.
    assert sorted(n for (_, outcome), n in outcomes.items() if outcome == "succeeded") == [1, 1, 1]
    assert (
        b"job.recovered"
        in (configs[0].parent / "daemon.log").read_bytes() + (configs[1].parent / "daemon.log").read_bytes()
    )
    database.dispose()


@pytest.mark.slow
def test_a_holder_frozen_past_its_lease_cannot_store_a_second_result(
    postgres_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    """A holder that truly lost its lease (frozen, as a partitioned host is, while the other daemon stayed
    connected) comes back to a job claimed again: its token is stale, so whatever it finished is refused
    and its run is in the history as ``fenced``; the job has one success and one set of results."""
    database = upgraded(postgres_url)
    data = write_dataset(tmp_path / "arith.jsonl", 24)
    root = tmp_path / "run"
    root.mkdir()
    configs = [_config(tmp_path, postgres_url, name, root, data) for name in ("a", "b")]
    daemons = [DaemonProcess(c, c.parent / "daemon.log", fresh=True) for c in configs]
    try:
        for daemon in daemons:
            daemon.wait_ready()
        copy_checkpoint(toy_run.last_checkpoint, root / "step_10")
        job_id, owner = wait_for(lambda: _holder(database), 60, "a claimed job")
        by_pid = {str(d.process.pid): d for d in daemons}
        holder = by_pid[owner.rsplit(":", 1)[1]]
        other = next(d for d in daemons if d is not holder)
        holder.process.send_signal(signal.SIGSTOP)
        wait_for(lambda: _held_by_another(database, owner), LEASE_SECS + 60, "the takeover", other.process)
        holder.process.send_signal(signal.SIGCONT)
        rows = wait_for(lambda: _all_succeeded(database, 1), 240, "the job succeeded", other.process)
        # The holder wakes, finds its claim gone (at its next heartbeat, or when it stores), and says so.
        wait_for(
            lambda: (
                b'"job.lost_lease"'
                in (configs[0].parent / "daemon.log").read_bytes()
                + (configs[1].parent / "daemon.log").read_bytes()
                or None
            ),
            60,
            "job.lost_lease",
        )
        for daemon in daemons:
            assert daemon.stop() == 0
    finally:
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGCONT)
                daemon.process.kill()
    assert [(j.id, j.attempts) for j in rows] == [(job_id, 2)]
    with database.session() as session:
        history = sorted((a.attempt, a.outcome) for a in session.scalars(select(JobAttempt)))
        metrics = Counter(r.metric for r in queries.result_rows(session))
    assert history == [(1, "fenced"), (2, "succeeded")]
    assert metrics and set(metrics.values()) == {1}
    database.dispose()
