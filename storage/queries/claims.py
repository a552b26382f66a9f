"""Claims and their leases: taking a job from the queue, keeping it, giving it back.

A claim's number (the job's ``attempts``) is its fencing token: every write of a claim's owner is
conditioned on it (:func:`owned_running`), so a daemon whose lease ran out cannot touch the claim that
replaced its own. The claim's submission to a scheduler (its handle and state) is stored here too.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, case, func, select, update
from sqlalchemy.orm import Session

from storage.models import Checkpoint, EvalJob, JobState, RunSchedule, utcnow


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    task: str
    stage: str
    attempts: int
    checkpoint_id: int
    checkpoint_path: str
    layout: str
    step: int | None
    run: str
    run_id: int


#: States a claim takes. Deferral records why this node could not start jobs; the caller claims only once
#: its own check passed, and on a shared PostgreSQL queue another node's deferral must not hold it back.
CLAIMABLE = (JobState.PENDING, JobState.DEFERRED)


#: 1 for a job that ran before and failed (a crash, a time-out; a job given back without spending an
#: attempt, as at shutdown or a free preemption, has none spent), else 0: ordered first, so a checkpoint
#: that failed an attempt never runs ahead of a fresh one, whatever its step.
RETRIED = case((EvalJob.attempts > 0, 1), else_=0)


def _pairs(rows: Iterable[Any]) -> dict[Any, Any]:
    # ``dict(result)`` would take a Result for a mapping (it has ``keys()``).
    return {key: value for key, value in rows}


def _claimable(
    runs: Collection[int] | None, tasks: Collection[str] | None, exclude_runs: Collection[int] = ()
) -> ColumnElement[bool]:
    condition: ColumnElement[bool] = EvalJob.state.in_(CLAIMABLE)
    if runs is not None:
        condition = and_(condition, Checkpoint.run_id.in_(list(runs)))
    if exclude_runs:
        condition = and_(condition, Checkpoint.run_id.not_in(list(exclude_runs)))
    if tasks is not None:
        condition = and_(condition, EvalJob.task.in_(list(tasks)))
    return condition


def _fair_run_order(
    session: Session, runs: Collection[int] | None = None, tasks: Collection[str] | None = None
) -> list[int]:
    """Runs with pending jobs, the one most in need first: one with a fresh job before one with only
    retries (:data:`RETRIED`), then the most urgent priority, then the fewest running jobs, then the
    longest since one of its jobs started. One busy run cannot starve the rest."""
    rows = session.execute(
        select(Checkpoint.run_id, func.max(EvalJob.priority), func.min(RETRIED))
        .select_from(EvalJob)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .where(_claimable(runs, tasks))
        .group_by(Checkpoint.run_id)
    )
    pending: dict[int, int] = {}
    only_retries: dict[int, int] = {}
    for run_id, priority, retried in rows:
        pending[run_id], only_retries[run_id] = priority, retried
    if len(pending) < 2:
        return list(pending)
    running: dict[int, int] = _pairs(
        session.execute(
            select(Checkpoint.run_id, func.count())
            .select_from(EvalJob)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .where(EvalJob.state == JobState.RUNNING)
            .group_by(Checkpoint.run_id)
        )
    )
    started: dict[int, datetime | None] = _pairs(
        session.execute(
            select(RunSchedule.run_id, RunSchedule.last_claimed_at).where(
                RunSchedule.run_id.in_(list(pending))
            )
        )
    )
    never = datetime.min.replace(tzinfo=UTC)

    def need(run_id: int) -> tuple[int, int, int, datetime, int]:
        last = started.get(run_id)
        if last is not None and last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        return (only_retries[run_id], -pending[run_id], running.get(run_id, 0), last or never, run_id)

    return sorted(pending, key=need)


def claim_next_job(
    session: Session,
    owner: str,
    *,
    oldest_first: Collection[int] = frozenset(),
    runs: Collection[int] | None = None,
    tasks: Collection[str] | None = None,
    newest_first: bool = False,
    exclude_runs: Collection[int] = (),
) -> ClaimedJob | None:
    """Move the most urgent pending (or deferred) job to ``running`` for ``owner``.

    Jobs that failed an attempt (:data:`RETRIED`) come after every fresh one. Runs take turns
    (:func:`_fair_run_order`); within a run, higher priority (quick before full) comes first, then the
    newest step, or the oldest for runs in ``oldest_first``. ``FOR UPDATE SKIP LOCKED``
    lets daemons on PostgreSQL share the queue without two taking one job; on SQLite the transaction
    already holds the database's write lock. ``runs`` and ``tasks`` (None: any) keep a daemon to the
    jobs its config knows: a run or task removed by a reload waits for a daemon that has it.
    ``exclude_runs``: runs at their limit of jobs in Slurm. ``newest_first`` (``priority = "newest"``):
    the job of the checkpoint that became ready last, whichever its run, quick before full within it.
    """
    if newest_first:
        job = session.scalar(
            select(EvalJob)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .where(_claimable(runs, tasks, exclude_runs))
            .order_by(RETRIED, Checkpoint.ready_at.desc().nulls_last(), EvalJob.priority.desc(), EvalJob.id)
            .limit(1)
            .with_for_update(skip_locked=True, of=EvalJob)
        )
        return None if job is None else _claim(session, job, owner)
    for run_id in _fair_run_order(session, runs, tasks):
        if run_id in exclude_runs:
            continue
        by_step = EvalJob.step.asc() if run_id in oldest_first else EvalJob.step.desc()
        job = session.scalar(
            select(EvalJob)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .where(_claimable(runs, tasks), Checkpoint.run_id == run_id)
            .order_by(RETRIED, EvalJob.priority.desc(), by_step.nulls_last(), EvalJob.id)
            .limit(1)
            .with_for_update(skip_locked=True, of=EvalJob)
        )
        if job is not None:
            return _claim(session, job, owner)
    return None


def claim_job(session: Session, job_id: int, owner: str) -> ClaimedJob | None:
    """Claim one job for ``owner`` out of the queue's order (``evald eval --store``, whose worker has
    already run); None when it is running under another claim or has succeeded (its results are stored)."""
    job = session.scalar(select(EvalJob).where(EvalJob.id == job_id).with_for_update())
    if job is None or job.state in (JobState.RUNNING, JobState.SUCCEEDED):
        return None
    return _claim(session, job, owner)


def database_now(session: Session) -> datetime:
    """The database's clock: leases are judged on it, so daemons whose hosts' clocks disagree still agree
    on how old a heartbeat is. SQLite has one daemon (and no clock of its own worth asking)."""
    if session.get_bind().dialect.name == "postgresql":
        now = session.scalar(select(func.now()))
        assert isinstance(now, datetime)
        return now.astimezone(UTC)
    return utcnow()


def _claim(session: Session, job: EvalJob, owner: str) -> ClaimedJob:
    now = database_now(session)
    checkpoint = job.checkpoint
    session.execute(
        update(RunSchedule).where(RunSchedule.run_id == checkpoint.run_id).values(last_claimed_at=now)
    )
    job.state = JobState.RUNNING
    job.attempts += 1
    job.claimed_by = owner
    job.started_at = now
    job.heartbeat_at = now
    # The last attempt's error stays readable while it runs again (``evald status``: retrying).
    job.wait_reason = None
    job.deferred_at = None
    job.stuck_at = None
    # A new claim is submitted anew: the last one's submission is its history row's now.
    job.executor_handle = None
    job.executor_state = None
    session.flush()
    return as_claimed(job)


def as_claimed(job: EvalJob) -> ClaimedJob:
    checkpoint = job.checkpoint
    return ClaimedJob(
        id=job.id,
        task=job.task,
        stage=job.stage,
        attempts=job.attempts,
        checkpoint_id=checkpoint.id,
        checkpoint_path=checkpoint.path,
        layout=checkpoint.layout,
        step=checkpoint.step,
        run=checkpoint.run.name,
        run_id=checkpoint.run_id,
    )


def owned_running(job_id: int, owner: str, attempt: int | None = None) -> ColumnElement[bool]:
    """The job is running under ``owner``, and under the claim ``attempt`` (the fencing token) if given:
    a daemon whose lease ran out and whose job was claimed again (by anyone, itself included) holds an
    older token, so nothing it writes afterwards can touch the new claim."""
    held = and_(EvalJob.id == job_id, EvalJob.state == JobState.RUNNING, EvalJob.claimed_by == owner)
    return held if attempt is None else and_(held, EvalJob.attempts == attempt)


def heartbeat(session: Session, job_id: int, owner: str, attempt: int | None = None) -> bool:
    """Refresh a running job's lease; False if the job is no longer ours (under ``attempt``)."""
    result = session.execute(
        update(EvalJob)
        .where(owned_running(job_id, owner, attempt))
        .values(heartbeat_at=database_now(session))
    )
    return bool(getattr(result, "rowcount", 0))


def requeue_job(
    session: Session,
    *,
    job_id: int,
    owner: str,
    attempt: int | None = None,
    error_kind: str | None = None,
    error: str | None = None,
) -> bool:
    """Give a running job back to the queue (shutdown, the host's disk full): it runs again, and its
    attempt is not a failure. ``error_kind`` and ``error``, when given, say why until it runs again."""
    values: dict[str, Any] = {
        "state": JobState.PENDING,
        "claimed_by": None,
        "heartbeat_at": None,
        "attempts": EvalJob.attempts - 1,
        "executor_handle": None,
        "executor_state": None,
    }
    if error_kind is not None:
        values.update(error_kind=error_kind, error=error)
    result = session.execute(update(EvalJob).where(owned_running(job_id, owner, attempt)).values(**values))
    return bool(getattr(result, "rowcount", 0))


def record_handle(session: Session, *, job_id: int, owner: str, attempt: int, handle: str | None) -> bool:
    """Record the claim's submission to a scheduler (``Handle.to_json``; None clears it), fenced by the
    claim ``attempt`` like a result; False if the job is no longer ours."""
    result = session.execute(
        update(EvalJob).where(owned_running(job_id, owner, attempt)).values(executor_handle=handle)
    )
    return bool(getattr(result, "rowcount", 0))


def set_executor_state(session: Session, *, job_id: int, owner: str, attempt: int, state: str | None) -> bool:
    """Where the scheduler has the claim's submission now (``PENDING (Resources)``), or what the claim
    waits for before one (its checkpoint downloading), for ``evald status``; None: nothing to say."""
    result = session.execute(
        update(EvalJob).where(owned_running(job_id, owner, attempt)).values(executor_state=state)
    )
    return bool(getattr(result, "rowcount", 0))


def job_handle(session: Session, job_id: int) -> tuple[int, str | None] | None:
    """A running job's claim number and the submission stored with it; None unless it is running."""
    row = session.execute(
        select(EvalJob.attempts, EvalJob.executor_handle).where(
            EvalJob.id == job_id, EvalJob.state == JobState.RUNNING
        )
    ).first()
    return None if row is None else (row[0], row[1])


def executor_states(session: Session) -> dict[int, tuple[str | None, str | None]]:
    """Job id → (stored handle, scheduler state) of every running job handed to an executor."""
    rows = session.execute(
        select(EvalJob.id, EvalJob.executor_handle, EvalJob.executor_state).where(
            EvalJob.state == JobState.RUNNING, EvalJob.executor_handle.is_not(None)
        )
    )
    return {job_id: (handle, state) for job_id, handle, state in rows}


def submitted_per_run(session: Session) -> dict[int, int]:
    """Run id → jobs of it running through an executor (submitted to Slurm, by any daemon)."""
    return _pairs(
        session.execute(
            select(Checkpoint.run_id, func.count())
            .select_from(EvalJob)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .where(EvalJob.state == JobState.RUNNING, EvalJob.executor_handle.is_not(None))
            .group_by(Checkpoint.run_id)
        )
    )


def running_claims(session: Session, ids: Collection[int]) -> dict[int, int]:
    """Of the jobs ``ids``, those running now → their claim number (a claim that is over is absent)."""
    if not ids:
        return {}
    return _pairs(
        session.execute(
            select(EvalJob.id, EvalJob.attempts).where(
                EvalJob.id.in_(list(ids)), EvalJob.state == JobState.RUNNING
            )
        )
    )


def checkpoints_in_use(session: Session, paths: Collection[str]) -> set[str]:
    """Of the checkpoint ``paths``, those with a job still to run or running (a retry, another task)."""
    if not paths:
        return set()
    rows = session.execute(
        select(Checkpoint.path)
        .join(EvalJob, EvalJob.checkpoint_id == Checkpoint.id)
        .where(
            Checkpoint.path.in_(list(paths)),
            EvalJob.state.in_((JobState.PENDING, JobState.DEFERRED, JobState.RUNNING)),
        )
        .distinct()
    )
    return {path for (path,) in rows}
