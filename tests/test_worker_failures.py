"""How a job's worker group fails: real worker processes under the real job runner and database.

Out of memory retries with half the batch size down to 1; a rank that dies fails the job with that
rank's stderr tail; a timeout kills the whole group; a job that fails ``max_attempts`` times stays
failed with its history; and in every case no worker process is left (the process table is read).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest

from daemon.analysis import report
from daemon.config import Config, DaemonConfig, InferenceConfig, RunConfig, TaskConfig
from daemon.running.runner import JobRunner
from inference.faults import OOM_ABOVE_ENV
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.conftest import ToyRun
from tests.deadlines import Deadline
from tests.forkserver import worker_python
from tests.harness import (
    DaemonProcess,
    free_port,
    jobs,
    no_worker_left,
    upgraded,
    wait_for,
    worker_processes,
    write_config,
    write_dataset,
)
from tests.session_cache import cache_root

pytestmark = pytest.mark.slow


def _runner(
    tmp_path: Path,
    database: Database,
    checkpoint: Path,
    *,
    items: int = 8,
    batch_size: int = 4,
    **inference: object,
) -> JobRunner:
    dataset = tmp_path / "data.jsonl"
    write_jsonl(held_out_problems(items, seed=1), dataset)
    config = Config(
        runs=(RunConfig(name="r", root=tmp_path / "run"),),
        tasks=(
            TaskConfig(
                name="arith",
                dataset=dataset,
                prompt_template=PROMPT_TEMPLATE,
                id_field="id",
                batch_size=batch_size,
                max_new_tokens=12,
            ),
        ),
        inference=InferenceConfig.model_validate({"threads": 1, "python": worker_python(), **inference}),
        daemon=DaemonConfig(state_dir=tmp_path / "state"),
    )
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(tmp_path / "run"))
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=str(checkpoint),
            name=checkpoint.name,
            step=30,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=30, tasks=["arith"])
    return JobRunner(config, database, "test:1")


def _drive(runner: JobRunner, timeout: float = 300) -> None:
    """The daemon's loop, reduced to the runner: claim, poll, until the queue is empty."""
    deadline = Deadline(timeout)
    while not deadline.expired():
        runner.poll()
        if not runner.running and not runner.claim_and_start():
            return
        time.sleep(0.05)
    raise AssertionError("the job did not end in time")


def _history(database: Database) -> list[tuple[str, str | None, int]]:
    with database.session() as s:
        (job,) = queries.job_rows(s)
        return [(a.outcome, a.error_kind, a.batch_size) for a in queries.job_history(s, job.id)]


def _job(database: Database) -> queries.JobRow:
    with database.session() as s:
        (job,) = queries.job_rows(s)
        return job


def test_out_of_memory_retries_the_group_with_half_the_batch(
    database: Database, toy_run: ToyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OOM_ABOVE_ENV, "2")
    runner = _runner(tmp_path, database, toy_run.last_checkpoint, batch_size=4, tp=2)

    _drive(runner)

    assert _history(database) == [("out_of_memory", "out_of_memory", 4), ("succeeded", None, 2)]
    job = _job(database)
    assert (job.state, job.attempts) == ("succeeded", 1)
    assert not worker_processes(tmp_path / "state")


@pytest.mark.long
def test_out_of_memory_at_batch_size_one_fails_the_job(
    database: Database, toy_run: ToyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OOM_ABOVE_ENV, "0")
    runner = _runner(tmp_path, database, toy_run.last_checkpoint, batch_size=2, engine="hf")

    _drive(runner)

    assert _history(database) == [("out_of_memory", "out_of_memory", 2), ("failed", "out_of_memory", 1)]
    job = _job(database)
    assert (job.state, job.error_kind) == ("failed", "out_of_memory")
    assert job.error is not None and "out of memory at batch size 1" in job.error
    assert not worker_processes(tmp_path / "state")


def test_out_of_memory_while_shutting_down_requeues_instead_of_rerunning(
    database: Database, toy_run: ToyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OOM_ABOVE_ENV, "2")
    runner = _runner(tmp_path, database, toy_run.last_checkpoint, batch_size=4, engine="hf")
    assert runner.claim_and_start()

    runner.shutdown(grace_secs=120)  # the worker runs out of memory within the grace period

    assert _history(database) == [("requeued", "out_of_memory", 4)]
    job = _job(database)
    assert (job.state, job.attempts) == ("pending", 0)  # the next claim starts at the full batch
    assert not runner.running and not worker_processes(tmp_path / "state")


def _rank_process(state: Path, rank: int) -> psutil.Process | None:
    for process in worker_processes(state):
        try:
            if "inference.worker" in process.cmdline() and process.environ().get("RANK") == str(rank):
                return process
        except psutil.NoSuchProcess:
            continue
    return None


def _writing_to(log: Path) -> psutil.Process | None:
    """The process whose stderr is ``log``: the rank itself, which sends its output to its log
    (inference/worker.py). Under the session's fork server a rank is a fork client and the forked child
    that does the work; killing the client left the child alive until the server saw the client gone, and
    in that gap rank 0, stopped by torchrun, closed the connection and the child wrote gloo's error to
    this log: the job then failed with that error, not with the SIGKILL the test sent."""
    for process in psutil.process_iter():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{process.pid}/fd/2").readlink() == log.resolve():
                return process
    return None


def test_a_killed_rank_fails_the_job_with_its_stderr_tail(
    database: Database, toy_run: ToyRun, tmp_path: Path
) -> None:
    runner = _runner(
        tmp_path, database, toy_run.last_checkpoint, items=400, batch_size=1, tp=2, max_attempts=1
    )
    state = tmp_path / "state"
    assert runner.claim_and_start()
    (job_dir,) = (state / "jobs").iterdir()
    # Mid-job: the model is loaded and batches are running.
    rank_log = job_dir / "rank-1.log"
    wait_for(lambda: rank_log.is_file() and b'"task.loaded"' in rank_log.read_bytes(), 120, "rank 1 to load")
    victim = wait_for(lambda: _writing_to(rank_log), 10, "rank 1's process")
    victim.send_signal(signal.SIGKILL)

    _drive(runner)

    job = _job(database)
    assert (job.state, job.error_kind) == ("failed", "crash")
    assert job.error is not None
    # The cause is the first line (what status shows); the rank's log tail follows it and is in the
    # attempt's history.
    assert job.error.splitlines()[0] == "rank 1 failed (killed by SIGKILL), with no error in its log"
    assert _history(database) == [("failed", "crash", 1)]
    with database.session() as s:
        (attempt,) = queries.job_history(s, job.id)
    assert attempt.error is not None and '"task.loaded"' in attempt.error and '"rank": 1' in attempt.error
    assert not worker_processes(state)
    # Under the session's fork server, torchrun itself was forked (tests/fork_client.py), and the death of
    # a rank reached it all the same.
    forks = cache_root() / "forks" / "forkserver.log"
    if forks.is_file():
        notes = [json.loads(line) for line in forks.read_text().splitlines() if line.startswith("{")]
        assert any(
            n["event"] == "forked"
            and n["argv"][:2] == ["-m", "torch.distributed.run"]
            and str(job_dir) in n["argv"][-1]
            for n in notes
        )


def test_a_timeout_kills_the_group_and_the_job_fails_after_max_attempts(
    database: Database, toy_run: ToyRun, tmp_path: Path
) -> None:
    runner = _runner(
        tmp_path,
        database,
        toy_run.last_checkpoint,
        items=400,
        batch_size=1,
        tp=2,
        max_attempts=2,
        job_timeout_secs=6,
    )

    _drive(runner)

    assert _history(database) == [("retried", "timeout", 1), ("failed", "timeout", 1)]
    job = _job(database)
    assert (job.state, job.attempts, job.error_kind) == ("failed", 2, "timeout")
    no_worker_left(tmp_path / "state")
    # What a user reads: the failure in `evald status`, each try in `evald history`.
    with database.session() as s:
        summary = report.status(queries.checkpoint_rows(s), queries.job_rows(s), ["r"])
        attempts = json.loads(report.history(queries.job_history(s, job.id), "json"))
    (problem,) = summary["r"]["problems"]
    assert (problem["job"], problem["kind"], problem["attempts"]) == (job.id, "timeout", 2)
    assert f"(job {job.id}, 2 attempt(s)): worker killed after 6 s" in report.status_text(summary)
    assert [(a["attempt"], a["outcome"], a["tp"], a["error"]) for a in attempts] == [
        (1, "retried", 2, "worker killed after 6 s"),
        (2, "failed", 2, "worker killed after 6 s"),
    ]


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_a_daemon_killed_by_sigkill_takes_its_worker_group_with_it(
    sqlite_url: str, toy_run: ToyRun, tmp_path: Path, launcher: str
) -> None:
    """No daemon left to kill anything. torchrun: each rank is tied to torchrun, and torchrun to the
    daemon. DeepSpeed's launcher (from a hostfile of this node): its per-node launcher is not ours, so
    the ranks watch the daemon's pid."""
    database = upgraded(sqlite_url)
    extra = "tp = 2"
    if launcher == "deepspeed":
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("localhost slots=2\n")
        extra += (
            f'\nhostfile = "{hostfile}"\nlauncher_args = ["--no_ssh_check", "--master_addr", "127.0.0.1", '
            f'"--master_port", "{free_port()}"]'
        )
    config = write_config(
        tmp_path,
        sqlite_url,
        dataset=write_dataset(tmp_path / "big.jsonl", 400),
        batch_size=1,
        inference_extra=extra,
    )
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    daemon.wait_ready()
    shutil.copytree(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    state = tmp_path / "state"
    wait_for(lambda: _rank_process(state, 1), 120, "rank 1 of the group", daemon.process)
    # torchrun (in the launcher's pid) and two ranks; or DeepSpeed's runner, its per-node launcher, two ranks.
    assert len(worker_processes(state)) == (3 if launcher == "torchrun" else 4)

    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL

    wait_for(lambda: not worker_processes(state), 30, "every process of the group to die")
    assert [j.state for j in jobs(database)] == ["running"]  # redone by the next daemon
    database.dispose()
