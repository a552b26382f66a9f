"""The queue's entries: runs, their checkpoints, and the jobs enqueued for each checkpoint.

Callers open the transaction (``Database.session()``); each function here is one step inside it, so a
caller can make several steps atomic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage.database import insert_for
from storage.models import Checkpoint, CheckpointState, EvalJob, JobState, Run, utcnow


def ensure_run(session: Session, name: str, root: str) -> int:
    """The run's id, recording it first if it is new.

    Daemons starting together on one database each call this for the same runs: the insert does nothing
    when another got there first (a select-then-insert would fail one of them on the unique name).
    """
    insert = insert_for(session)
    session.execute(
        insert(Run)
        .values(name=name, root=root, created_at=utcnow())
        .on_conflict_do_nothing(index_elements=["name"])
    )
    run = session.scalars(select(Run).where(Run.name == name)).one()
    if run.root != root:
        run.root = root
    return run.id


def checkpoint_states(session: Session, run_id: int) -> dict[str, CheckpointState]:
    """Path → state of every checkpoint already recorded for a run."""
    rows = session.execute(select(Checkpoint.path, Checkpoint.state).where(Checkpoint.run_id == run_id))
    return {path: state for path, state in rows}


def record_checkpoint(
    session: Session,
    *,
    run_id: int,
    path: str,
    name: str,
    step: int | None,
    epoch: int | None,
    layout: str,
    state: CheckpointState,
    reason: str | None = None,
) -> int:
    """Insert a checkpoint, or move an existing one to ``state``; returns its id.

    Daemons sharing a database may both settle one checkpoint at the same moment: the insert does
    nothing for the second, which then updates the row the first wrote.
    """
    insert = insert_for(session)
    session.execute(
        insert(Checkpoint)
        .values(run_id=run_id, path=path, name=name, step=step, epoch=epoch, layout=layout, state=state)
        .on_conflict_do_nothing(index_elements=["run_id", "path"])
    )
    checkpoint = session.scalars(
        select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.path == path)
    ).one()
    checkpoint.state = state
    checkpoint.reason = reason
    checkpoint.layout = layout
    if state is CheckpointState.READY and checkpoint.ready_at is None:
        checkpoint.ready_at = utcnow()
    session.flush()
    return checkpoint.id


@dataclass(frozen=True)
class NewCheckpoint:
    run_id: int
    path: str
    name: str
    step: int | None
    epoch: int | None
    layout: str
    reason: str


def register_discovered(session: Session, checkpoints: Sequence[NewCheckpoint]) -> None:
    """Insert checkpoints first seen incomplete; ones already known are left alone.

    One executemany of a statement compiled once, because a restart may find thousands at once.
    """
    if not checkpoints:
        return
    now = utcnow()
    rows = [
        {
            "run_id": c.run_id,
            "path": c.path,
            "name": c.name,
            "step": c.step,
            "epoch": c.epoch,
            "layout": c.layout,
            "state": CheckpointState.DISCOVERED,
            "reason": c.reason,
            "discovered_at": now,
            "updated_at": now,
        }
        for c in checkpoints
    ]
    insert = insert_for(session)
    session.execute(insert(Checkpoint).on_conflict_do_nothing(index_elements=["run_id", "path"]), rows)


def enqueue_jobs(
    session: Session,
    *,
    checkpoint_id: int,
    step: int | None,
    tasks: Iterable[str],
    stage: str = "full",
    priority: int = 0,
) -> int:
    """Create one pending job per task unless it exists; returns how many were new.

    ``ON CONFLICT DO NOTHING`` on the unique (checkpoint, task, stage) makes this idempotent even when two
    daemons sharing PostgreSQL discover the same checkpoint at once.
    """
    rows = [
        {
            "checkpoint_id": checkpoint_id,
            "task": task,
            "stage": stage,
            "step": step,
            "state": JobState.PENDING,
            "priority": priority,
            "attempts": 0,
            "created_at": utcnow(),
        }
        for task in tasks
    ]
    if not rows:
        return 0
    insert = insert_for(session)
    statement = (
        insert(EvalJob)
        .values(rows)
        .on_conflict_do_nothing(index_elements=["checkpoint_id", "task", "stage"])
        .returning(EvalJob.id)
    )
    return len(session.execute(statement).all())


def mark_checkpoint(session: Session, checkpoint_id: int, state: CheckpointState, reason: str) -> None:
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == checkpoint_id)
        .values(state=state, reason=reason, updated_at=utcnow())
    )


def job_at(session: Session, *, checkpoint_id: int, task: str, stage: str) -> tuple[int, JobState] | None:
    """The id and state of the checkpoint's job for ``task`` and ``stage``, if there is one."""
    row = session.execute(
        select(EvalJob.id, EvalJob.state).where(
            EvalJob.checkpoint_id == checkpoint_id, EvalJob.task == task, EvalJob.stage == stage
        )
    ).one_or_none()
    return None if row is None else (row[0], row[1])


def job_state(session: Session, job_id: int) -> JobState | None:
    return session.scalar(select(EvalJob.state).where(EvalJob.id == job_id))
