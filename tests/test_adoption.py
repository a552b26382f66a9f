"""A daemon killed after its worker wrote the result but before it stored it: the next daemon stores that
result instead of evaluating the checkpoint again."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from storage import queries
from storage.models import JobAttempt
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    evald,
    jobs,
    running_daemon,
    upgraded,
    wait_for,
    worker_processes,
    write_config,
    write_dataset,
)

pytestmark = pytest.mark.slow


def test_a_result_written_before_the_daemon_died_is_adopted_not_recomputed(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    data = write_dataset(tmp_path / "arith.jsonl", 8)
    # On PostgreSQL the dead daemon's job is an orphan once its lease (5 s here) has run out.
    config = write_config(tmp_path, database_url, dataset=data, scheduling_extra="recover_secs = 0.5")
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    first = DaemonProcess(config, tmp_path / "daemon-1.log", fresh=True)
    first.wait_ready()
    wait_for(lambda: [j for j in jobs(database) if j.state == "running"] or None, 60, "a running job")
    # The job is claimed before its worker starts: freeze the daemon only once the worker runs.
    wait_for(lambda: worker_processes(tmp_path / "state") or None, 60, "the worker process")
    # Frozen, the daemon cannot store what its worker writes; then it dies.
    first.process.send_signal(signal.SIGSTOP)
    result = wait_for(
        lambda: next((tmp_path / "state" / "jobs").glob("*/result.json"), None), 180, "the result file"
    )
    first.stop(signal.SIGKILL)
    assert [j.state for j in jobs(database)] == ["running"]

    with running_daemon(config, tmp_path / "daemon-2.log") as second:
        rows = wait_for(
            lambda: [j for j in jobs(database) if j.state == "succeeded"] or None,
            180,
            "the adopted result",
            second.process,
        )
        assert second.stop() == 0
    assert [(j.step, j.attempts) for j in rows] == [(10, 1)]
    log = (tmp_path / "daemon-2.log").read_text()
    assert '"job.adopted"' in log and '"job.started"' not in log
    assert str(result) in log
    with database.session() as session:
        history = Counter((a.job_id, a.attempt, a.outcome) for a in session.scalars(select(JobAttempt)))
        metrics = Counter(r.metric for r in queries.result_rows(session))
    assert history == Counter({(rows[0].id, 1, "succeeded"): 1})
    assert metrics and set(metrics.values()) == {1}
    database.dispose()


@pytest.mark.long
def test_a_worker_run_killed_with_its_daemon_is_in_the_history_as_lost(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    """Every worker run has its history row: the one whose daemon was killed under it gets hers from the
    daemon that recovers the job (``lost``), beside the run that then evaluated it."""
    database = upgraded(database_url)
    data = write_dataset(tmp_path / "arith.jsonl", 200)
    config = write_config(
        tmp_path, database_url, dataset=data, batch_size=2, scheduling_extra="recover_secs = 0.5"
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    first = DaemonProcess(config, tmp_path / "daemon-1.log", fresh=True)
    first.wait_ready()
    wait_for(lambda: worker_processes(tmp_path / "state") or None, 60, "the worker process")
    owner = f":{first.process.pid}"
    first.stop(signal.SIGKILL)
    # The worker follows its daemon (it watches its parent), without writing a result.
    wait_for(lambda: not worker_processes(tmp_path / "state") or None, 60, "the worker to end")
    # The run that evaluates it again need not be long.
    write_dataset(tmp_path / "arith.jsonl", 4)
    with running_daemon(config, tmp_path / "daemon-2.log") as second:
        rows = wait_for(
            lambda: [j for j in jobs(database) if j.state == "succeeded"] or None,
            180,
            "the job evaluated again",
            second.process,
        )
        assert second.stop() == 0
    [job] = rows
    assert job.attempts == 2
    with database.session() as session:
        history = queries.job_history(session, job.id)
    assert [(a.attempt, a.outcome, a.error_kind) for a in history] == [
        (1, "lost", "daemon_lost"),
        (2, "succeeded", None),
    ]
    lost = history[0]
    assert lost.error is not None and owner in lost.error and "stopped while it ran" in lost.error
    assert (lost.engine, lost.batch_size) == ("deepspeed", 2)
    assert lost.finished_at >= lost.started_at
    shown = evald("--config", str(config), "history", str(job.id))
    assert shown.returncode == 0 and "lost" in shown.stdout and "stopped while it ran" in shown.stdout
    database.dispose()
