"""Recovery of orphans: running jobs whose daemon is taken for dead, found, requeued, failed or taken over.

On SQLite the instance lock proves no other daemon is alive; on a shared PostgreSQL queue a claim whose
heartbeat is older than the lease (by the database's clock) is an orphan.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from storage.models import EvalJob, JobState, utcnow
from storage.queries.claims import ClaimedJob, as_claimed, database_now


@dataclass(frozen=True)
class Orphan:
    """A running job whose daemon is taken for dead, as its claim stands."""

    id: int
    #: Its claim number: the attempt the dead daemon ran (and the fencing token of its result).
    attempts: int
    claimed_by: str | None
    started_at: datetime | None
    heartbeat_at: datetime | None
    task: str
    #: The claim's submission to a scheduler (``Handle.to_json``), if one was recorded.
    executor_handle: str | None = None


def orphans(
    session: Session, *, lease: timedelta, every_running: bool, keep: Collection[int] = ()
) -> list[Orphan]:
    """Running jobs whose daemon died, locked until the transaction ends.

    ``every_running`` is right for SQLite, where the instance lock proves no other daemon is alive. On a
    shared PostgreSQL queue only jobs whose heartbeat is older than ``lease`` by the database's clock are
    orphans. ``keep`` are the caller's own live jobs: after a database outage longer than the lease their
    heartbeats are old, but their daemon is alive and about to store them.
    """
    condition = EvalJob.state == JobState.RUNNING
    if keep:
        condition = and_(condition, EvalJob.id.not_in(list(keep)))
    if not every_running:
        cutoff = database_now(session) - lease
        condition = and_(condition, or_(EvalJob.heartbeat_at.is_(None), EvalJob.heartbeat_at < cutoff))
    found = session.execute(
        select(
            EvalJob.id,
            EvalJob.attempts,
            EvalJob.claimed_by,
            EvalJob.started_at,
            EvalJob.heartbeat_at,
            EvalJob.task,
            EvalJob.executor_handle,
        )
        .where(condition)
        .order_by(EvalJob.id)
        .with_for_update(skip_locked=True)
    )
    return [Orphan(*row) for row in found]


def requeue_orphans(session: Session, ids: Collection[int]) -> None:
    if ids:
        session.execute(
            update(EvalJob)
            .where(EvalJob.id.in_(list(ids)), EvalJob.state == JobState.RUNNING)
            .values(state=JobState.PENDING, claimed_by=None, heartbeat_at=None)
        )


def fail_orphan(session: Session, job_id: int, *, kind: str, error: str) -> None:
    """An orphan that has spent its attempts fails instead of running again (a job that kills its
    daemon would otherwise bring down every daemon that claims it, forever)."""
    session.execute(
        update(EvalJob)
        .where(EvalJob.id == job_id, EvalJob.state == JobState.RUNNING)
        .values(state=JobState.FAILED, error_kind=kind, error=error, finished_at=utcnow())
    )


def take_over(session: Session, job_id: int, owner: str) -> ClaimedJob:
    """Make an orphan (locked by :func:`orphans`) ``owner``'s, as it stands: its dead daemon's worker
    finished, and the new owner stores what it wrote instead of running it again."""
    job = session.get_one(EvalJob, job_id)
    job.claimed_by = owner
    job.heartbeat_at = database_now(session)
    session.flush()
    return as_claimed(job)


def recover_orphans(
    session: Session, *, lease: timedelta, every_running: bool, keep: Collection[int] = ()
) -> list[int]:
    """Requeue running jobs whose daemon died (see :func:`orphans`); returns their ids."""
    ids = [o.id for o in orphans(session, lease=lease, every_running=every_running, keep=keep)]
    requeue_orphans(session, ids)
    return ids
