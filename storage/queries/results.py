"""Stored metric values: what ``evald results`` and the HTTP API list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, func, select
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

    The newest step is found per (run, task, stage) on the jobs (one row per checkpoint, not one per
    metric), so the result rows read are those of one job per series group.
    """
    newest = (
        select(
            Checkpoint.run_id.label("run_id"),
            EvalJob.task.label("task"),
            EvalJob.stage.label("stage"),
            func.max(Checkpoint.step).label("step"),
        )
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .where(EvalJob.state == JobState.SUCCEEDED, Checkpoint.step.is_not(None))
        .group_by(Checkpoint.run_id, EvalJob.task, EvalJob.stage)
    )
    if run is not None:
        newest = newest.join(Run, Checkpoint.run_id == Run.id).where(Run.name == run)
    last = newest.subquery()
    query = (
        _result_select()
        .join(
            last,
            and_(
                last.c.run_id == Checkpoint.run_id,
                last.c.task == EvalJob.task,
                last.c.stage == EvalJob.stage,
                last.c.step == Checkpoint.step,
            ),
        )
        .where(EvalJob.state == JobState.SUCCEEDED)
        # Two checkpoint folders at one step: the newest job's value wins (kept last below).
        .order_by(Run.name, EvalJob.task, EvalJob.stage, Result.metric, EvalJob.id)
    )
    rows: dict[tuple[str, str, str, str], ResultRow] = {}
    for row in session.execute(query):
        result = ResultRow(*row)
        rows[(result.run, result.task, result.stage, result.metric)] = result
    return list(rows.values())
