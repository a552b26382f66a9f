"""The Slurm tools off the daemon's loop, on the tests' real cluster: while an ``sbatch`` hangs (a
PATH-shadowing ``sbatch`` that waits) the daemon still discovers a new checkpoint and stores another job's
result within seconds of its ``exit.json``; and a job held back by ``max_queued_per_run`` says so on the
job (``wait_reason``) until the claim that submits it."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from daemon.config import load_config
from daemon.running.runner import JobRunner
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    all_jobs_done,
    checkpoints,
    jobs,
    log_events,
    running_daemon,
    upgraded,
    wait_for,
    write_dataset,
)
from tests.slurmcluster import SlurmCluster, slurm_cluster
from tests.slurmdaemon import SlurmDaemon, slurm_config

__all__ = ["slurm_cluster"]

WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.2; done\n"
WAIT_S = 240.0


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("slurm-offloop-data") / "arith.jsonl", 8)


@pytest.fixture(scope="module")
def trained(toy_run: ToyRun) -> Path:
    return toy_run.last_checkpoint


def _go(daemon: SlurmDaemon) -> None:
    """Let every job waiting in its setup script go on."""
    for folder in daemon.job_dir.iterdir():
        if folder.is_dir() and not folder.name.startswith("."):
            (folder / "go").touch()


def _succeeded(database: Database, step: int) -> bool:
    return any(j.step == step and j.state == "succeeded" for j in jobs(database))


@pytest.mark.long
def test_a_hung_sbatch_holds_neither_discovery_nor_another_jobs_result(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    setup = tmp_path / "setup.sh"
    setup.write_text(WAIT_FOR_GO)
    hang = tmp_path / "sbatch-hangs"
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=dataset,
        hang=hang,
        executor_extra=f'setup_script = "{setup}"\nprobe_job_dir = false',
    )
    run = tmp_path / "run"
    copy_checkpoint(trained, run / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            wait_for(
                lambda: [j["state"] for j in daemon.queue()] == ["RUNNING"] or None, 120, "job 1 running"
            )
            # From now on sbatch hangs: the next checkpoint's submission waits in it.
            hang.touch()
            copy_checkpoint(trained, run / "step_20")
            wait_for(lambda: daemon.sbatch_calls() == 2 or None, 60, "the second sbatch", process.process)
            hung_at = time.monotonic()
            _go(daemon)
            # The running job's result is stored while the other's sbatch still hangs, within seconds of
            # its exit.json (not at the next poll of a loop held by sbatch).
            wait_for(lambda: _succeeded(database, 10) or None, 120, "job 1 stored", process.process)
            copy_checkpoint(trained, run / "step_30")
            wait_for(
                lambda: any(c.name == "step_30" for c in checkpoints(database)) or None,
                30,
                "step_30 discovered",
                process.process,
            )
            assert hang.exists() and time.monotonic() - hung_at < 55  # sbatch is still hanging
            (exit_file,) = [f / "exit.json" for f in daemon.job_dir.iterdir() if f.name.startswith("1-")]
            (stored,) = [e for e in log_events(process.log, "job.succeeded") if e.get("job_id") == 1]
            lag = stored_at(stored) - exit_file.stat().st_mtime
            assert lag < 3.0, f"job 1 stored {lag:.1f} s after its exit.json"
            hang.unlink()

            def all_done() -> list[queries.JobRow] | None:
                _go(daemon)
                return all_jobs_done(database, 3)

            rows = wait_for(all_done, WAIT_S, "the three jobs", process.process)
            assert process.stop() == 0
    finally:
        hang.unlink(missing_ok=True)
        daemon.cancel_all()
    assert sorted((j.step or 0, j.state, j.attempts) for j in rows) == [
        (10, "succeeded", 1),
        (20, "succeeded", 1),
        (30, "succeeded", 1),
    ]
    # One Slurm job each: the hung sbatch answered in time and nothing was submitted twice.
    names = sorted(j["name"] for j in daemon.queue())
    assert len(names) == len(set(names)) == 3 and daemon.sbatch_calls() == 3


def stored_at(event: dict[str, object]) -> float:
    """The time of a log event (structlog's ISO ``timestamp``, UTC), in seconds since the epoch."""
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


def _ready(database: Database, root: Path, trained: Path, step: int) -> None:
    copy_checkpoint(trained, root / f"step_{step}")
    with database.session() as session:
        run_id = queries.ensure_run(session, "toy", str(root))
        checkpoint = queries.record_checkpoint(
            session,
            run_id=run_id,
            path=str(root / f"step_{step}"),
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(session, checkpoint_id=checkpoint, step=step, tasks=["arith"])


def test_a_job_held_back_by_max_queued_per_run_says_why_until_it_is_submitted(
    slurm_cluster: SlurmCluster,
    sqlite_url: str,
    dataset: Path,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon, database, runner = _held_jobs(
        slurm_cluster, sqlite_url, dataset, trained, tmp_path, monkeypatch, limit="max_queued_per_run = 1"
    )
    try:
        assert runner.claim_and_start()
        (first,) = runner.running

        def handle_stored() -> bool:
            runner.poll()
            with database.session() as session:
                stored = queries.job_handle(session, first)
            return stored is not None and stored[1] is not None

        wait_for(handle_stored, 60, "the first job's handle")
        assert not runner.claim_and_start()  # the run is at its limit
        (held,) = [j for j in jobs(database) if j.state == "pending"]
        assert held.wait_reason == "held: max_queued_per_run 1 reached for run 'toy'"
        # The first job's Slurm state is stored on it, with Slurm's reason.

        def state() -> str | None:
            runner.poll()
            return _state(database, first)

        wait_for(lambda: state() == "PENDING (JobHeldUser)" or None, 30, "the first job's state")

        daemon.cancel_all()  # the first job ends (cancelled outside evald): the run has room again
        wait_for(lambda: (runner.poll(), not runner.running)[1] or None, 60, "the first job's end")
        assert runner.claim_and_start()
        (again,) = [j for j in jobs(database) if j.id == held.id]
        assert (again.state, again.wait_reason) == ("running", None)
    finally:
        runner.shutdown(0)
        daemon.cancel_all()
        database.dispose()


def _state(database: Database, job_id: int) -> str | None:
    with database.session() as session:
        return queries.executor_states(session).get(job_id, (None, None))[1]


def test_calls_run_off_the_caller_and_are_applied_by_collect_one_per_key() -> None:
    import threading
    from collections.abc import Callable

    from daemon.running.executors.calls import Apply, Calls

    calls = Calls(workers=2)
    release = threading.Event()
    applied: list[str] = []
    threads: list[str] = []

    def work(name: str) -> Callable[[], Apply]:
        def run() -> Apply:
            threads.append(threading.current_thread().name)
            release.wait(10)
            return lambda: applied.append(name)

        return run

    try:
        assert calls.start(("job", 1), work("first"))
        assert not calls.start(("job", 1), work("again"))  # one per key
        assert calls.start(("check", 7), work("check"))
        # Nothing is applied while the work runs, however often the loop collects.
        assert calls.collect() == 0 and applied == [] and calls.busy(("job", 1)) and calls.busy_any("job")
        release.set()
        calls.settle(10)
        assert sorted(applied) == ["check", "first"] and not calls.busy_any("job")
        assert threads and all(t.startswith("evald-executor") for t in threads)

        def broken() -> Apply:
            raise RuntimeError("a bug in a call")

        calls.start(("job", 2), broken)
        with pytest.raises(RuntimeError, match="a bug in a call"):
            calls.settle(10)
        assert not calls.busy(("job", 2))
    finally:
        release.set()
        calls.close()


def test_jobs_held_back_by_max_queued_say_so(
    slurm_cluster: SlurmCluster,
    sqlite_url: str,
    dataset: Path,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon, database, runner = _held_jobs(
        slurm_cluster, sqlite_url, dataset, trained, tmp_path, monkeypatch, limit="max_queued = 1"
    )
    try:
        runner.settle(60)
        assert runner.has_capacity() and runner.claim_and_start()
        runner.settle(60)
        assert not runner.has_capacity()
        (held,) = [j for j in jobs(database) if j.state == "pending"]
        assert held.wait_reason == "held: max_queued 1 reached"
    finally:
        runner.shutdown(0)
        daemon.cancel_all()
        database.dispose()


def _held_jobs(
    slurm_cluster: SlurmCluster,
    sqlite_url: str,
    dataset: Path,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    limit: str,
) -> tuple[SlurmDaemon, Database, JobRunner]:
    """A runner whose Slurm jobs are submitted held (they stay queued) under ``limit``, two steps ready."""
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=dataset,
        executor_extra=f'extra_sbatch = ["--hold"]\n{limit}\nprobe_job_dir = false',
    )
    monkeypatch.setenv("PATH", daemon.env["PATH"])
    database = upgraded(sqlite_url)
    for step in (10, 20):
        _ready(database, tmp_path / "run", trained, step)
    return daemon, database, JobRunner(load_config(daemon.config), database, "test:1")
