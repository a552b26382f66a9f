"""A full disk while the worker writes its result (issue 31): the host's fault, not the checkpoint's.

The job folder lives on a real, small tmpfs that is filled once the worker has started: the worker
evaluates, fails to write ``result.json`` (ENOSPC), says "disk full writing result at PATH" and exits
with its own status; the daemon's runner requeues the job without spending an attempt, with one
``job.disk_full`` line, and once there is room again the same job is evaluated on its first attempt.
Needs root for the mount (the reliability suite's disk_full scenario does the same).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from daemon.config import Config, DaemonConfig, InferenceConfig, RunConfig, TaskConfig
from daemon.running.runner import JobRunner
from inference.spec import EXIT_DISK_FULL
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from reliability.scenarios.disk_full import fill, tmpfs
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.conftest import ToyRun
from tests.deadlines import Deadline
from tests.forkserver import worker_python
from tests.harness import worker_processes

pytestmark = pytest.mark.slow


@pytest.fixture
def small_state(tmp_path: Path) -> Iterator[Path]:
    try:
        with tmpfs(tmp_path / "state", "2m") as folder:
            yield folder
    except PermissionError as exc:
        pytest.skip(str(exc))


def _runner(tmp_path: Path, state: Path, database: Database, checkpoints: list[Path]) -> JobRunner:
    dataset = tmp_path / "data.jsonl"
    write_jsonl(held_out_problems(6, seed=1), dataset)
    config = Config(
        runs=(RunConfig(name="r", root=tmp_path / "run"),),
        tasks=(
            TaskConfig(
                name="arith",
                dataset=dataset,
                prompt_template=PROMPT_TEMPLATE,
                id_field="id",
                max_new_tokens=12,
            ),
        ),
        inference=InferenceConfig.model_validate(
            {"threads": 1, "engine": "hf", "max_attempts": 1, "python": worker_python()}
        ),
        daemon=DaemonConfig(state_dir=state),
    )
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(tmp_path / "run"))
        for step, checkpoint in enumerate(checkpoints, start=1):
            checkpoint_id = queries.record_checkpoint(
                s,
                run_id=run_id,
                path=str(checkpoint),
                name=f"step_{step}",
                step=step,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=["arith"])
    return JobRunner(config, database, "test:1")


def _wait(runner: JobRunner, timeout: float = 180) -> None:
    deadline = Deadline(timeout)
    while runner.running and not deadline.expired():
        runner.poll()
        time.sleep(0.05)
    assert not runner.running, "the worker did not end in time"


def test_a_full_disk_writing_the_result_requeues_without_spending_an_attempt(
    database: Database, toy_run: ToyRun, tmp_path: Path, small_state: Path
) -> None:
    good = toy_run.path / "step_15"
    runner = _runner(tmp_path, small_state, database, [good, toy_run.last_checkpoint])
    with structlog.testing.capture_logs() as events:
        assert runner.claim_and_start()  # the newest: step 2 (toy step_30)
        (running,) = runner.running.values()
        result = running.spec.result_path
        filler = fill(small_state)  # the job folder is there; the worker has not written anything yet
        _wait(runner)

        with database.session() as s:
            rows = {j.step: j for j in queries.job_rows(s)}
            history = queries.job_history(s, rows[2].id)
        assert (rows[2].state, rows[2].attempts, rows[2].error_kind) == ("pending", 0, "disk_full")
        assert rows[2].error == f"disk full writing result at {result} (worker exit status {EXIT_DISK_FULL})"
        assert [(a.outcome, a.error_kind) for a in history] == [("requeued", "disk_full")]
        full = [e for e in events if e["event"] == "job.disk_full"]
        assert len(full) == 1 and full[0]["error"] == rows[2].error
        assert runner.paused  # no claim into a full disk at once

        filler.unlink()
        deadline = Deadline(300)
        while not deadline.expired():
            runner.poll()
            if not runner.running and not runner.claim_and_start() and not runner.paused:
                with database.session() as s:
                    if all(j.state == "succeeded" for j in queries.job_rows(s)):
                        break
            time.sleep(0.05)

    with database.session() as s:
        rows = {j.step: j for j in queries.job_rows(s)}
        history = queries.job_history(s, rows[2].id)
    assert {step: (j.state, j.attempts) for step, j in rows.items()} == {
        1: ("succeeded", 1),
        2: ("succeeded", 1),
    }
    assert rows[2].error is None
    assert [(a.attempt, a.outcome, a.error_kind) for a in history] == [
        (1, "requeued", "disk_full"),
        (1, "succeeded", None),
    ]
    assert not worker_processes(small_state)
