"""Each (run, task, stage, metric)'s newest stored value: the daemon's, the API's and ``evald status``'s
"latest results", and the newest evaluated step of a series, on the ORM's models."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ScalarSelect, select
from sqlalchemy.orm import Session, aliased

from storage.models import Checkpoint, EvalJob, JobState, ResultSeries, Run
from storage.queries.results import ResultRow, result_select
from storage.tables import CHECKPOINTS, EVAL_JOBS, RESULTS, RUNS


def series_newest_step(series: Any) -> ScalarSelect[int | None]:
    """The newest step with a succeeded job of ``series`` (``ResultSeries`` or an alias of it), correlated:
    walked back from the run's newest checkpoint on ``ix_checkpoints_run_step``, each checkpoint's job
    found on the (checkpoint, task, stage) key, stopped at the first succeeded one. The job's state alone
    would let SQLite's planner (no statistics) take ``ix_eval_jobs_state_priority`` through every
    succeeded job instead: 30 ms per run at 100,000 jobs."""
    checkpoint, job = aliased(Checkpoint), aliased(EvalJob)
    return (
        select(checkpoint.step)
        .join(job, job.checkpoint_id == checkpoint.id)
        .where(
            checkpoint.run_id == series.run_id,
            job.task == series.task,
            job.stage == series.stage,
            job.state == JobState.SUCCEEDED,
            checkpoint.step.is_not(None),
        )
        .order_by(checkpoint.step.desc())
        .limit(1)
        .correlate(series)
        .scalar_subquery()
    )


def latest_results(session: Session, *, run: str | None = None) -> list[ResultRow]:
    """Each (run, task, stage, metric)'s row at the newest step evaluated for it.

    In two indexed steps, each simple enough that SQLite's planner (without statistics) keeps to the
    indexes. First the checkpoints at the newest succeeded step of each (run, task, stage) in
    ``result_series`` (written with each job's results, so no scan of every job finds the pairs): walked
    back from the run's newest checkpoint on ``ix_checkpoints_run_step`` and stopped at the first
    succeeded job. Then the result rows of those checkpoints' jobs, kept when the job is that series'
    and succeeded. A job's state in the SQL of either step would let SQLite drive it from
    ``ix_eval_jobs_state_priority`` through every succeeded job (20-80 ms at 100,000), and one statement
    joining the newest steps to the results lets it scan every result row.
    """
    newest_step = series_newest_step(ResultSeries)
    newest = (
        select(ResultSeries.run_id, ResultSeries.task, ResultSeries.stage, Checkpoint.id)
        .select_from(ResultSeries)
        .join(Checkpoint, (Checkpoint.run_id == ResultSeries.run_id) & (Checkpoint.step == newest_step))
    )
    if run is not None:
        newest = newest.join(Run, Run.id == ResultSeries.run_id).where(Run.name == run)
    wanted: set[tuple[int, str, str]] = set()
    checkpoints: set[int] = set()
    for run_id, task, stage, checkpoint_id in session.execute(newest):
        wanted.add((run_id, task, stage))
        checkpoints.add(checkpoint_id)
    if not checkpoints:
        return []
    query = (
        # The core tables result_select() joins (storage.tables), not the models' mapped ones: mixed, the
        # statement would name each table twice.
        result_select()
        .add_columns(CHECKPOINTS.c.run_id, EVAL_JOBS.c.state)
        .where(EVAL_JOBS.c.checkpoint_id.in_(checkpoints))
        # Two checkpoint folders at one step: the newest job's value wins (kept last below).
        .order_by(RUNS.c.name, EVAL_JOBS.c.task, EVAL_JOBS.c.stage, RESULTS.c.metric, EVAL_JOBS.c.id)
    )
    rows: dict[tuple[str, str, str, str], ResultRow] = {}
    for *fields, run_id, state in session.execute(query):
        result = ResultRow(*fields)
        if state == JobState.SUCCEEDED and (run_id, result.task, result.stage) in wanted:
            rows[(result.run, result.task, result.stage, result.metric)] = result
    return list(rows.values())
