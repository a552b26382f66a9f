"""Stored metric values: what ``evald results`` and the HTTP API list."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import Checkpoint, EvalJob, Result, Run


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


def result_rows(
    session: Session, *, run: str | None = None, task: str | None = None, metric: str | None = None
) -> list[ResultRow]:
    query = (
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
        .order_by(Run.name, Checkpoint.step, Checkpoint.name, EvalJob.task, EvalJob.stage, Result.metric)
    )
    if run is not None:
        query = query.where(Run.name == run)
    if task is not None:
        query = query.where(EvalJob.task == task)
    if metric is not None:
        query = query.where(Result.metric == metric)
    return [ResultRow(*row) for row in session.execute(query)]
