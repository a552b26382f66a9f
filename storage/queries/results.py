"""Stored metric values: what ``evald results`` and the HTTP API list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from storage.models import Checkpoint, EvalJob, JobState, Result, Run


@dataclass(frozen=True)
class MetricRow:
    name: str
    value: float
    n: int | None
    stderr: float | None


@dataclass(frozen=True)
class ResultRow:
    run: str
    checkpoint: str
    step: int | None
    epoch: int | None
    task: str
    stage: str
    metric: str
    value: float
    n: int | None
    stderr: float | None
    evaluated_at: datetime


def _result_select() -> Select[*tuple[Any, ...]]:
    return (
        select(
            Run.name,
            Checkpoint.name,
            Checkpoint.step,
            Checkpoint.epoch,
            EvalJob.task,
            EvalJob.stage,
            Result.metric,
            Result.value,
            Result.n,
            Result.stderr,
            EvalJob.finished_at,
        )
        .join(EvalJob, Result.job_id == EvalJob.id)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
    )


def result_rows(
    session: Session,
    *,
    run: str | None = None,
    task: str | None = None,
    metric: str | None = None,
    stage: str | None = None,
    step_min: int | None = None,
    step_max: int | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[ResultRow]:
    """Result rows by run, step, task, stage and metric; the step range is inclusive and leaves out
    checkpoints without a step. ``limit``/``offset`` page through them in that stable order."""
    query = _result_select().order_by(
        Run.name, Checkpoint.step, Checkpoint.name, EvalJob.task, EvalJob.stage, Result.metric, Result.id
    )
    if run is not None:
        query = query.where(Run.name == run)
    if task is not None:
        query = query.where(EvalJob.task == task)
    if stage is not None:
        query = query.where(EvalJob.stage == stage)
    if metric is not None:
        query = query.where(Result.metric == metric)
    if step_min is not None:
        query = query.where(Checkpoint.step >= step_min)
    if step_max is not None:
        query = query.where(Checkpoint.step <= step_max)
    if offset:
        query = query.offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return [ResultRow(*row) for row in session.execute(query)]


def latest_results(session: Session, *, run: str | None = None) -> list[ResultRow]:
    """Each (run, task, stage, metric)'s row at the newest step evaluated for it.

    Two steps, each on an index: the newest succeeded step per (run, task, stage) from the jobs (one row
    per checkpoint, not one per metric), then the result rows of the jobs at those steps. One join of the
    grouped steps back onto the results lets SQLite scan every result row instead.
    """
    newest = (
        select(Checkpoint.run_id, EvalJob.task, EvalJob.stage, func.max(Checkpoint.step))
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .where(EvalJob.state == JobState.SUCCEEDED, Checkpoint.step.is_not(None))
        .group_by(Checkpoint.run_id, EvalJob.task, EvalJob.stage)
    )
    if run is not None:
        newest = newest.where(Checkpoint.run_id.in_(select(Run.id).where(Run.name == run)))
    wanted = {(r, t, sg, st) for r, t, sg, st in session.execute(newest)}
    if not wanted:
        return []
    jobs = session.execute(
        select(EvalJob.id, Checkpoint.run_id, EvalJob.task, EvalJob.stage, Checkpoint.step)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .where(
            EvalJob.state == JobState.SUCCEEDED,
            Checkpoint.run_id.in_({r for r, _, _, _ in wanted}),
            Checkpoint.step.in_({st for _, _, _, st in wanted}),
        )
    )
    ids = [job_id for job_id, *key in jobs if tuple(key) in wanted]
    query = (
        _result_select()
        .where(Result.job_id.in_(ids))
        # Two checkpoint folders at one step: the newest job's value wins (kept last below).
        .order_by(Run.name, EvalJob.task, EvalJob.stage, Result.metric, EvalJob.id)
    )
    rows: dict[tuple[str, str, str, str], ResultRow] = {}
    for row in session.execute(query):
        result = ResultRow(*row)
        rows[(result.run, result.task, result.stage, result.metric)] = result
    return list(rows.values())
