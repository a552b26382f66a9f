"""Where every checkpoint and job stands: what ``evald status`` and the HTTP API list."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import Checkpoint, EvalJob, Run


@dataclass(frozen=True)
class CheckpointRow:
    run: str
    name: str
    path: str
    step: int | None
    state: str
    reason: str | None


@dataclass(frozen=True)
class JobRow:
    id: int
    run: str
    checkpoint: str
    step: int | None
    task: str
    stage: str
    state: str
    attempts: int
    error: str | None
    priority: int = 0
    #: Why a deferred or skipped job is not running.
    wait_reason: str | None = None
    error_kind: str | None = None
    #: Batches whose tp ranks disagreed, in the stored result (None: tp = 1 or not stored).
    tp_disagreements: int | None = None
    #: Inputs the stored result left out of its metrics (None: not stored, or stored before 0004).
    problems: int | None = None


def checkpoint_rows(session: Session, run: str | None = None) -> list[CheckpointRow]:
    query = (
        select(
            Run.name, Checkpoint.name, Checkpoint.path, Checkpoint.step, Checkpoint.state, Checkpoint.reason
        )
        .join(Run, Checkpoint.run_id == Run.id)
        .order_by(Run.name, Checkpoint.step, Checkpoint.name)
    )
    if run is not None:
        query = query.where(Run.name == run)
    return [
        CheckpointRow(run=r, name=n, path=p, step=s, state=str(st.value), reason=reason)
        for r, n, p, s, st, reason in session.execute(query)
    ]


def job_rows(session: Session, run: str | None = None) -> list[JobRow]:
    query = (
        select(
            EvalJob.id,
            Run.name,
            Checkpoint.name,
            Checkpoint.step,
            EvalJob.task,
            EvalJob.stage,
            EvalJob.state,
            EvalJob.attempts,
            EvalJob.error,
            EvalJob.priority,
            EvalJob.wait_reason,
            EvalJob.error_kind,
            EvalJob.tp_disagreements,
            EvalJob.problems,
        )
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .order_by(Run.name, Checkpoint.step, EvalJob.task, EvalJob.stage)
    )
    if run is not None:
        query = query.where(Run.name == run)
    return [
        JobRow(
            id=i,
            run=r,
            checkpoint=c,
            step=s,
            task=t,
            stage=sg,
            state=str(st.value),
            attempts=a,
            error=e,
            priority=p,
            wait_reason=w,
            error_kind=k,
            tp_disagreements=d,
            problems=n,
        )
        for i, r, c, s, t, sg, st, a, e, p, w, k, d, n in session.execute(query)
    ]
