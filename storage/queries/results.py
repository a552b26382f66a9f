"""Stored metric values: what ``evald results`` and the HTTP API list.

Read with SQLAlchemy's core alone, through :mod:`storage.tables` (``evald results`` imports no ORM: a
third of its instructions went to it); each series' newest values are :mod:`storage.queries.latest`'s.
Each function takes an ORM session (the daemon, the API) or a core connection (the CLI).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, select

from storage.tables import CHECKPOINTS, EVAL_JOBS, RESULTS, RUNS

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session


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

    @property
    def no_samples(self) -> bool:
        """A metric computed over no samples (``n = 0``): its stored value is no number, whatever it is."""
        return self.n == 0


def result_select() -> Select[*tuple[Any, ...]]:
    """A :class:`ResultRow`'s columns, in its order, over the four tables joined."""
    return (
        select(
            RUNS.c.name,
            CHECKPOINTS.c.name,
            CHECKPOINTS.c.step,
            CHECKPOINTS.c.epoch,
            EVAL_JOBS.c.task,
            EVAL_JOBS.c.stage,
            RESULTS.c.metric,
            RESULTS.c.value,
            RESULTS.c.n,
            RESULTS.c.stderr,
            EVAL_JOBS.c.finished_at,
        )
        .select_from(RESULTS)
        .join(EVAL_JOBS, RESULTS.c.job_id == EVAL_JOBS.c.id)
        .join(CHECKPOINTS, EVAL_JOBS.c.checkpoint_id == CHECKPOINTS.c.id)
        .join(RUNS, CHECKPOINTS.c.run_id == RUNS.c.id)
    )


def result_rows(
    session: Session | Connection,
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
    runs, checkpoints, jobs, results = RUNS.c, CHECKPOINTS.c, EVAL_JOBS.c, RESULTS.c
    query = result_select().order_by(
        runs.name, checkpoints.step, checkpoints.name, jobs.task, jobs.stage, results.metric, results.id
    )
    if run is not None:
        query = query.where(runs.name == run)
    if task is not None:
        query = query.where(jobs.task == task)
    if stage is not None:
        query = query.where(jobs.stage == stage)
    if metric is not None:
        query = query.where(results.metric == metric)
    if step_min is not None:
        query = query.where(checkpoints.step >= step_min)
    if step_max is not None:
        query = query.where(checkpoints.step <= step_max)
    if offset:
        query = query.offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return [ResultRow(*row) for row in session.execute(query)]


def run_exists(session: Session | Connection, name: str) -> bool:
    """Whether a run of that name is recorded: one index lookup, where ``run_rows`` also counts its
    checkpoints (the check every ``?run=`` route of the HTTP API makes first)."""
    return session.scalar(select(RUNS.c.id).where(RUNS.c.name == name)) is not None


def run_has_results(session: Session | Connection, run: str) -> bool:
    """Whether any result of ``run`` is stored."""
    query = (
        select(RESULTS.c.id)
        .join(EVAL_JOBS, RESULTS.c.job_id == EVAL_JOBS.c.id)
        .join(CHECKPOINTS, EVAL_JOBS.c.checkpoint_id == CHECKPOINTS.c.id)
        .join(RUNS, CHECKPOINTS.c.run_id == RUNS.c.id)
        .where(RUNS.c.name == run)
        .limit(1)
    )
    return session.scalar(query) is not None


def run_names(session: Session | Connection) -> list[str]:
    """Every recorded run's name, in name order (what an error about an unknown run lists)."""
    return list(session.scalars(select(RUNS.c.name).order_by(RUNS.c.name)))
