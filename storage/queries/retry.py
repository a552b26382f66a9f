"""Putting failed jobs back in the queue (``evald retry``), and what a job not yet run is waiting on.

A retried job is the same row made ``pending`` again: the daemons' claim (``FOR UPDATE SKIP LOCKED``)
takes it as any other queued job, so two daemons sharing PostgreSQL never both run it, and retrying it
twice still queues one job. Its history rows are never touched: ``evald history`` shows the earlier
attempts before the new one. Its claim count is kept, not reset: the count is the claim's fencing token
and names its worker folders, and a number used twice would let a stale claim or an old result pass
for the new one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage.models import Checkpoint, CheckpointState, EvalJob, JobState, Run
from storage.queries.claims import database_now

#: States a retry takes a job from: it ended without a result. A cancellation (Slurm ``scancel``, a
#: checkpoint deleted while queued) ends a job ``failed`` too, with its own error kind.
RETRYABLE_STATES = (JobState.FAILED,)
#: Error kinds of a ``failed`` job that was cancelled rather than failing (``--cancelled``).
CANCELLED_KINDS = ("cancelled", "checkpoint_vanished")
#: States in which a job is already queued: retrying it again changes nothing.
QUEUED_STATES = (JobState.PENDING, JobState.DEFERRED)
#: Checkpoint states with nothing left to evaluate: a retry would only fail again.
GONE_CHECKPOINTS = (CheckpointState.VANISHED, CheckpointState.INVALID)


@dataclass(frozen=True)
class RetryTarget:
    """A job a retry was asked for, and what became of it."""

    job_id: int
    run: str
    step: int | None
    task: str
    stage: str
    #: Its state before the retry.
    state: str
    error_kind: str | None
    #: ``queued`` (back in the queue), ``already_queued`` (pending or deferred: nothing to do), or
    #: ``refused`` (``reason`` says why).
    outcome: str
    reason: str | None = None


@dataclass(frozen=True)
class Submission:
    """A job's current claim as the database knows it before any worker run of it ended."""

    job_id: int
    run: str
    state: str
    attempts: int
    claimed_by: str | None
    #: The scheduler's id for it (a Slurm job id), from its stored handle; None before submission.
    slurm_job_id: str | None
    executor: str | None
    #: Where the scheduler has it (``PENDING (Resources)``), as the daemon last saw it.
    executor_state: str | None
    started_at: datetime | None
    #: Seconds since the claim began, while it runs (in the scheduler's queue or on a node).
    waiting_s: float | None
    error_kind: str | None
    error: str | None


def _target(job: EvalJob, run: str, outcome: str, reason: str | None = None) -> RetryTarget:
    return RetryTarget(
        job_id=job.id,
        run=run,
        step=job.step,
        task=job.task,
        stage=job.stage,
        state=str(job.state),
        error_kind=job.error_kind,
        outcome=outcome,
        reason=reason,
    )


def retry_job_rows(
    session: Session,
    *,
    job_id: int | None = None,
    run: str | None = None,
    failed: bool = False,
    cancelled: bool = False,
    step: int | None = None,
    task: str | None = None,
) -> list[RetryTarget]:
    """Queue again job ``job_id``, or the jobs of ``run`` that ``failed`` (any failed job) or were
    ``cancelled`` (failed by a cancellation), narrowed to ``step`` and ``task``; call inside one
    transaction. A job asked for by id that is not failed is reported ``refused`` (or
    ``already_queued``), never changed; a run's selection only ever holds failed jobs."""
    query = (
        select(EvalJob, Run.name, Checkpoint.state, Checkpoint.path)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .order_by(EvalJob.id)
    )
    if job_id is not None:
        query = query.where(EvalJob.id == job_id)
    else:
        query = query.where(Run.name == run, EvalJob.state.in_(RETRYABLE_STATES))
        if not failed:
            query = query.where(EvalJob.error_kind.in_(CANCELLED_KINDS))
        if step is not None:
            query = query.where(EvalJob.step == step)
        if task is not None:
            query = query.where(EvalJob.task == task)
    found: list[RetryTarget] = []
    for job, run_name, checkpoint_state, path in session.execute(query.with_for_update(of=EvalJob)).all():
        if job.state in QUEUED_STATES:
            found.append(_target(job, run_name, "already_queued"))
        elif job.state not in RETRYABLE_STATES:
            why = {
                JobState.RUNNING: "it is running now",
                JobState.SUCCEEDED: "it succeeded: its results are stored",
                JobState.SKIPPED: "it was skipped for a newer checkpoint (backlog newest_only)",
            }.get(job.state, "only a failed or cancelled job can be retried")
            found.append(_target(job, run_name, "refused", f"job {job.id} is {job.state}: {why}"))
        elif checkpoint_state in GONE_CHECKPOINTS:
            reason = f"job {job.id}: its checkpoint {path} is {checkpoint_state}: nothing to evaluate"
            found.append(_target(job, run_name, "refused", reason))
        else:
            queued = _requeue(session, job.id)
            found.append(_target(job, run_name, "queued" if queued else "already_queued"))
    return found


def _requeue(session: Session, job_id: int) -> bool:
    """The failed job back to ``pending``, its claim and deferral cleared; False when it was no longer
    failed (conditioned on the state read before: a concurrent retry, or anything else that moved the
    job, makes this update nothing, and the job is reported as that retry left it)."""
    moved = session.execute(
        update(EvalJob)
        .where(EvalJob.id == job_id, EvalJob.state.in_(RETRYABLE_STATES))
        .values(
            state=JobState.PENDING,
            claimed_by=None,
            heartbeat_at=None,
            wait_reason=None,
            deferred_at=None,
            stuck_at=None,
            executor_handle=None,
            executor_state=None,
        )
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(moved, "rowcount", 0))


def job_submission(session: Session, job_id: int) -> Submission | None:
    """Job ``job_id`` as it stands (its current claim's submission, if any); None if there is no such job."""
    job = session.get(EvalJob, job_id)
    if job is None:
        return None
    slurm_job_id = executor = None
    if job.executor_handle:
        try:
            handle = json.loads(job.executor_handle)
            slurm_job_id, executor = str(handle["external_id"]), str(handle["executor"])
        except (ValueError, KeyError, TypeError):
            slurm_job_id = None  # a handle of another shape: the state below still says where it is
    waiting_s = None
    if job.state == JobState.RUNNING and job.started_at is not None:
        started = job.started_at if job.started_at.tzinfo else job.started_at.replace(tzinfo=UTC)
        waiting_s = max(0.0, (database_now(session) - started).total_seconds())
    return Submission(
        job_id=job.id,
        run=job.checkpoint.run.name,
        state=str(job.state),
        attempts=job.attempts,
        claimed_by=job.claimed_by,
        slurm_job_id=slurm_job_id,
        executor=executor,
        executor_state=job.executor_state,
        started_at=job.started_at,
        waiting_s=waiting_s,
        error_kind=job.error_kind,
        error=job.error,
    )
