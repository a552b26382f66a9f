"""The query the lm-eval export reads beside the result rows, on both backends: the evaluated checkpoint's
path and its succeeded jobs' durations."""

from __future__ import annotations

from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from storage.queries.exports import EvaluatedCheckpoint, evaluated_checkpoints


def _job(database: Database, run_id: int, name: str, step: int, task: str, *, succeed: bool) -> None:
    with database.session() as s:
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/runs/r/{name}",
            name=name,
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[task])
        job = queries.claim_next_job(s, "h:1")
        assert job is not None
        if succeed:
            metrics = [queries.MetricRow("accuracy", 0.5, 4, 0.1)]
            assert queries.complete_job(
                s, job_id=job.id, owner="h:1", metrics=metrics, samples=[], duration_s=12.5, load_s=1.0
            )
        else:
            queries.fail_job(s, job_id=job.id, owner="h:1", kind="crash", error="boom", duration_s=3.0)


def test_the_evaluated_checkpoint_and_its_durations(database: Database) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", "/runs/r")
    _job(database, run_id, "step_10", 10, "gsm8k", succeed=True)
    _job(database, run_id, "step_10", 10, "math", succeed=True)
    _job(database, run_id, "step_20", 20, "gsm8k", succeed=False)
    with database.session() as s:
        both = evaluated_checkpoints(s, run="r", step=10, tasks={"gsm8k", "math"})
        one = evaluated_checkpoints(s, run="r", step=10, tasks={"math"})
        failed = evaluated_checkpoints(s, run="r", step=20, tasks={"gsm8k"})
        other_run = evaluated_checkpoints(s, run="nope", step=10, tasks={"gsm8k"})
    assert both == [EvaluatedCheckpoint("step_10", "/runs/r/step_10", 25.0)]
    assert one == [EvaluatedCheckpoint("step_10", "/runs/r/step_10", 12.5)]
    # A failed job is not an evaluation; another run's name finds nothing.
    assert failed == [] and other_run == []
