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
    first = DaemonProcess(config, tmp_path / "daemon-1.log")
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
