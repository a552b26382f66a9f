"""The statements behind scheduling: each run's frequency state, checkpoint plans, deferral and events.

Like :mod:`storage.queries`, every function is one step inside a transaction the caller opened, so a
plan, the anchor it resets and the jobs it creates commit together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from storage.database import insert_for
from storage.models import (
    Checkpoint,
    CheckpointState,
    EvalJob,
    Event,
    JobState,
    Plan,
    Result,
    Run,
    RunSchedule,
)

WAITING_JOB_STATES = (JobState.PENDING, JobState.DEFERRED)


@dataclass
class Schedule:
    """A run's frequency state, mutable while a planning pass works on it; :func:`save_schedule` stores it."""

    run_id: int
    anchor_step: int
    anchor_epoch: int
    anchor_at: datetime
    evaluated: int
    every_steps: int | None
    every_reason: str | None


@dataclass(frozen=True)
class PlanCandidate:
    id: int
    name: str
    path: str
    step: int | None
    epoch: int | None
    plan: Plan | None
    planned_at: datetime | None


@dataclass(frozen=True)
class SeriesPoint:
    step: int | None
    value: float
    stderr: float | None


@dataclass(frozen=True)
class StuckJob:
    id: int
    run_id: int
    run: str
    step: int | None
    task: str
    stage: str
    reason: str | None
    deferred_at: datetime


def ensure_schedule(session: Session, run_id: int, now: datetime) -> None:
    """Create the run's frequency state on its first start: the counters start at step 0, epoch 0, now.

    ``ON CONFLICT DO NOTHING``: two daemons sharing PostgreSQL may start at once.
    """
    insert = insert_for(session)
    row = {"run_id": run_id, "anchor_step": 0, "anchor_epoch": 0, "anchor_at": now, "evaluated": 0}
    session.execute(
        insert(RunSchedule).values(**row, updated_at=now).on_conflict_do_nothing(index_elements=["run_id"])
    )


def load_schedule(session: Session, run_id: int) -> Schedule:
    row = session.get(RunSchedule, run_id, with_for_update=True)
    if row is None:
        raise LookupError(f"run {run_id} has no schedule row (ensure_schedule not called)")
    return Schedule(
        run_id=row.run_id,
        anchor_step=row.anchor_step,
        anchor_epoch=row.anchor_epoch,
        anchor_at=row.anchor_at,
        evaluated=row.evaluated,
        every_steps=row.every_steps,
        every_reason=row.every_reason,
    )


def save_schedule(session: Session, schedule: Schedule, now: datetime) -> None:
    session.execute(
        update(RunSchedule)
        .where(RunSchedule.run_id == schedule.run_id)
        .values(
            anchor_step=schedule.anchor_step,
            anchor_epoch=schedule.anchor_epoch,
            anchor_at=schedule.anchor_at,
            evaluated=schedule.evaluated,
            every_steps=schedule.every_steps,
            every_reason=schedule.every_reason,
            updated_at=now,
        )
    )


def schedules(session: Session) -> dict[str, Schedule]:
    """Run name → frequency state, for ``evald status``."""
    rows = session.execute(select(Run.name, RunSchedule).join(RunSchedule, RunSchedule.run_id == Run.id))
    return {
        name: Schedule(
            row.run_id,
            row.anchor_step,
            row.anchor_epoch,
            row.anchor_at,
            row.evaluated,
            row.every_steps,
            row.every_reason,
        )
        for name, row in rows
    }


def _candidates(session: Session, *conditions: object) -> list[PlanCandidate]:
    rows = session.scalars(
        select(Checkpoint).where(*conditions).order_by(Checkpoint.step.asc().nulls_first(), Checkpoint.id)  # type: ignore[arg-type]
    )
    return [PlanCandidate(c.id, c.name, c.path, c.step, c.epoch, c.plan, c.planned_at) for c in rows]


def unplanned(session: Session, run_id: int) -> list[PlanCandidate]:
    """Ready checkpoints the frequency policy has not looked at yet, oldest step first."""
    return _candidates(
        session,
        Checkpoint.run_id == run_id,
        Checkpoint.state == CheckpointState.READY,
        Checkpoint.plan.is_(None),
    )


def waiting(session: Session, run_id: int) -> list[PlanCandidate]:
    """Checkpoints waiting for the time trigger, oldest step first."""
    return _candidates(session, Checkpoint.run_id == run_id, Checkpoint.plan == Plan.WAITING)


def due_before(session: Session, run_id: int, step: int) -> tuple[int, int | None] | None:
    """The step and epoch of the run's highest-step checkpoint planned due below ``step``: what a
    checkpoint that became ready late is judged against."""
    row = session.execute(
        select(Checkpoint.step, Checkpoint.epoch)
        .where(
            Checkpoint.run_id == run_id,
            Checkpoint.plan == Plan.DUE,
            Checkpoint.step.is_not(None),
            Checkpoint.step < step,
        )
        .order_by(Checkpoint.step.desc())
        .limit(1)
    ).first()
    if row is None or row.step is None:
        return None
    return row.step, row.epoch


def newest_checkpoint(session: Session, run_id: int) -> PlanCandidate | None:
    """The highest-step checkpoint of the run in any state but invalid or vanished."""
    found = _candidates(
        session,
        Checkpoint.run_id == run_id,
        Checkpoint.step.is_not(None),
        Checkpoint.state.in_((CheckpointState.DISCOVERED, CheckpointState.READY)),
    )
    return found[-1] if found else None


def recent_plan_times(session: Session, run_id: int, count: int = 8) -> list[datetime]:
    """When the run's newest ``count`` planned checkpoints were planned, oldest first."""
    rows = session.scalars(
        select(Checkpoint.planned_at)
        .where(Checkpoint.run_id == run_id, Checkpoint.planned_at.is_not(None), Checkpoint.step.is_not(None))
        .order_by(Checkpoint.step.desc())
        .limit(count)
    )
    return sorted(at for at in rows if at is not None)


def set_plan(session: Session, checkpoint_id: int, plan: Plan, reason: str, now: datetime) -> None:
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == checkpoint_id)
        .values(plan=plan, plan_reason=reason, planned_at=now)
    )


def supersede(
    session: Session, run_id: int, *, below_step: int, reason: str, keep_path: str | None = None
) -> list[int]:
    """Skip the run's jobs that have not started, on checkpoints older than ``below_step`` (except the one
    at ``keep_path``); returns their ids. A checkpoint none of whose jobs ever ran is marked skipped with
    the same reason.

    A job another daemon is claiming right now is locked: it is left alone (it starts), and waiting for
    it here could deadlock with that claim, which takes the run's schedule row after the job's.
    """
    older = select(Checkpoint.id).where(Checkpoint.run_id == run_id, Checkpoint.step < below_step)
    if keep_path is not None:
        older = older.where(Checkpoint.path != keep_path)
    ids = list(
        session.scalars(
            select(EvalJob.id)
            .where(EvalJob.checkpoint_id.in_(older), EvalJob.state.in_(WAITING_JOB_STATES))
            .with_for_update(skip_locked=True)
        )
    )
    if not ids:
        return []
    session.execute(
        update(EvalJob)
        .where(EvalJob.id.in_(ids), EvalJob.state.in_(WAITING_JOB_STATES))
        .values(state=JobState.SKIPPED, wait_reason=reason)
    )
    touched = select(EvalJob.checkpoint_id).where(EvalJob.id.in_(ids))
    still_evaluated = select(EvalJob.checkpoint_id).where(
        EvalJob.checkpoint_id.in_(touched), EvalJob.state != JobState.SKIPPED
    )
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id.in_(touched), Checkpoint.id.not_in(still_evaluated))
        .values(plan=Plan.SKIPPED, plan_reason=reason)
    )
    return ids


def metric_series(session: Session, *, run_id: int, task: str, stage: str, metric: str) -> list[SeriesPoint]:
    """Stored values of one metric for one run, task and stage, by step."""
    rows = session.execute(
        select(Checkpoint.step, Result.value, Result.stderr)
        .join(EvalJob, Result.job_id == EvalJob.id)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .where(
            Checkpoint.run_id == run_id,
            EvalJob.task == task,
            EvalJob.stage == stage,
            EvalJob.state == JobState.SUCCEEDED,
            Result.metric == metric,
        )
        .order_by(Checkpoint.step.asc().nulls_first(), EvalJob.id)
    )
    return [SeriesPoint(step, value, stderr) for step, value, stderr in rows]


def defer_pending(session: Session, reason: str, now: datetime) -> int:
    """Move every pending job to ``deferred`` with ``reason``; returns how many were newly deferred.

    A job already deferred keeps the moment it was first deferred (the stuck limit counts from it) and
    takes the new reason.
    """
    newly = session.execute(
        update(EvalJob)
        .where(EvalJob.state == JobState.PENDING)
        .values(
            state=JobState.DEFERRED, wait_reason=reason, deferred_at=func.coalesce(EvalJob.deferred_at, now)
        )
    )
    session.execute(
        update(EvalJob)
        .where(EvalJob.state == JobState.DEFERRED, EvalJob.wait_reason != reason)
        .values(wait_reason=reason)
    )
    return int(getattr(newly, "rowcount", 0))


#: How the reason of a pending job held back by the executor's queue limits begins.
HELD_PREFIX = "held: "


def hold_pending(session: Session, held: Mapping[int, str], everyone: str | None = None) -> int:
    """Say why pending jobs wait though they could be claimed: ``held`` maps a run id to its reason
    (``max_queued_per_run`` reached), ``everyone`` is every run's (``max_queued`` reached). Reasons of
    runs held no longer are cleared; a reason that is not a hold (a deferral's) is left. Each reason
    begins with :data:`HELD_PREFIX`. Returns how many jobs changed."""
    pending = and_(
        EvalJob.state == JobState.PENDING,
        or_(EvalJob.wait_reason.is_(None), EvalJob.wait_reason.like(f"{HELD_PREFIX}%")),
    )
    changed = 0
    if everyone is not None:
        done = session.execute(
            update(EvalJob)
            .where(pending, or_(EvalJob.wait_reason.is_(None), EvalJob.wait_reason != everyone))
            .values(wait_reason=everyone)
        )
        return int(getattr(done, "rowcount", 0))
    for run_id, reason in held.items():
        of_run = select(Checkpoint.id).where(Checkpoint.run_id == run_id)
        done = session.execute(
            update(EvalJob)
            .where(
                pending,
                EvalJob.checkpoint_id.in_(of_run),
                or_(EvalJob.wait_reason.is_(None), EvalJob.wait_reason != reason),
            )
            .values(wait_reason=reason)
        )
        changed += int(getattr(done, "rowcount", 0))
    free = select(Checkpoint.id).where(Checkpoint.run_id.not_in(list(held)))
    done = session.execute(
        update(EvalJob)
        .where(pending, EvalJob.wait_reason.is_not(None), EvalJob.checkpoint_id.in_(free))
        .values(wait_reason=None)
    )
    return changed + int(getattr(done, "rowcount", 0))


def run_names(session: Session, run_ids: Iterable[int]) -> dict[int, str]:
    """Run id → the run's name, for the ids given that exist."""
    ids = list(run_ids)
    if not ids:
        return {}
    return {run_id: name for run_id, name in session.execute(select(Run.id, Run.name).where(Run.id.in_(ids)))}


def release_deferred(session: Session) -> int:
    """Deferred jobs back to ``pending`` once the resources are there; ``deferred_at`` stays until one
    starts, so a job bouncing between the two still reaches its stuck limit."""
    result = session.execute(
        update(EvalJob).where(EvalJob.state == JobState.DEFERRED).values(state=JobState.PENDING)
    )
    return int(getattr(result, "rowcount", 0))


def count_jobs(session: Session, *states: JobState) -> int:
    query = select(func.count()).select_from(EvalJob).where(EvalJob.state.in_(states))
    return int(session.scalar(query) or 0)


def mark_stuck(session: Session, *, deferred_before: datetime, now: datetime) -> list[StuckJob]:
    """Deferred jobs past their limit and not yet reported: mark them and record a ``stuck`` event each."""
    rows = session.execute(
        select(EvalJob, Checkpoint.run_id, Run.name)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .where(
            EvalJob.state == JobState.DEFERRED,
            EvalJob.stuck_at.is_(None),
            and_(EvalJob.deferred_at.is_not(None), EvalJob.deferred_at < deferred_before),
        )
        .with_for_update(skip_locked=True, of=EvalJob)
    )
    stuck = []
    for job, run_id, run in rows:
        assert job.deferred_at is not None
        job.stuck_at = now
        stuck.append(
            StuckJob(job.id, run_id, run, job.step, job.task, job.stage, job.wait_reason, job.deferred_at)
        )
    for item in stuck:
        waited = (now - item.deferred_at).total_seconds()
        add_event(
            session,
            kind="stuck",
            run_id=item.run_id,
            job_id=item.id,
            message=f"job {item.id} ({item.task}/{item.stage} at step {item.step}) "
            f"deferred for {waited:.0f} s: {item.reason}",
            now=now,
        )
    session.flush()
    return stuck


def add_event(
    session: Session, *, kind: str, run_id: int | None, job_id: int | None, message: str, now: datetime
) -> None:
    session.add(Event(kind=kind, run_id=run_id, job_id=job_id, message=message, created_at=now))


@dataclass(frozen=True)
class EventRow:
    created_at: datetime
    kind: str
    run: str | None
    job_id: int | None
    message: str


def events(session: Session, *, kinds: Iterable[str] | None = None) -> list[EventRow]:
    query = select(Event.created_at, Event.kind, Run.name, Event.job_id, Event.message).outerjoin(
        Run, Event.run_id == Run.id
    )
    if kinds is not None:
        query = query.where(Event.kind.in_(list(kinds)))
    return [EventRow(*row) for row in session.execute(query.order_by(Event.id))]


@dataclass(frozen=True)
class PlanRow:
    run: str
    checkpoint: str
    step: int | None
    plan: str
    reason: str | None
    planned_at: datetime | None


def plan_rows(session: Session, run: str | None = None) -> list[PlanRow]:
    query = (
        select(
            Run.name,
            Checkpoint.name,
            Checkpoint.step,
            Checkpoint.plan,
            Checkpoint.plan_reason,
            Checkpoint.planned_at,
        )
        .join(Run, Checkpoint.run_id == Run.id)
        .where(Checkpoint.plan.is_not(None))
        .order_by(Run.name, Checkpoint.step, Checkpoint.name)
    )
    if run is not None:
        query = query.where(Run.name == run)
    return [
        PlanRow(r, c, step, str(plan.value) if plan is not None else "", reason, at)
        for r, c, step, plan, reason, at in session.execute(query)
    ]
