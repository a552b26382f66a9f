"""The evaluation queue: runs, checkpoints and jobs from discovery to ``succeeded`` or ``failed``.

Callers open the transaction (``Database.session()``); each function here is one step inside it, so a
caller can make several steps atomic (a job's results, samples and ``succeeded`` commit together).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, literal, or_, select, update
from sqlalchemy.orm import Session

from storage.database import insert_for
from storage.models import (
    Checkpoint,
    CheckpointState,
    EvalJob,
    JobAttempt,
    JobState,
    Result,
    ResultSeries,
    Run,
    RunSchedule,
    Sample,
    SampleProblem,
    utcnow,
)
from storage.queries.results import MetricRow
from storage.queries.samples import ProblemRow, SampleRow


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


#: States a claim takes. Deferral records why this node could not start jobs; the caller claims only once
#: its own check passed, and on a shared PostgreSQL queue another node's deferral must not hold it back.
CLAIMABLE = (JobState.PENDING, JobState.DEFERRED)


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
    """Runs with pending jobs, the one most in need first: the most urgent priority, then the fewest
    running jobs, then the longest since one of its jobs started. One busy run cannot starve the rest."""
    pending: dict[int, int] = _pairs(
        session.execute(
            select(Checkpoint.run_id, func.max(EvalJob.priority))
            .select_from(EvalJob)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .where(_claimable(runs, tasks))
            .group_by(Checkpoint.run_id)
        )
    )
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

    def need(run_id: int) -> tuple[int, int, datetime, int]:
        last = started.get(run_id)
        if last is not None and last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        return (-pending[run_id], running.get(run_id, 0), last or never, run_id)

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

    Runs take turns (:func:`_fair_run_order`); within a run, higher priority (quick before full) comes
    first, then the newest step, or the oldest for runs in ``oldest_first``. ``FOR UPDATE SKIP LOCKED``
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
            .order_by(Checkpoint.ready_at.desc().nulls_last(), EvalJob.priority.desc(), EvalJob.id)
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
            .order_by(EvalJob.priority.desc(), by_step.nulls_last(), EvalJob.id)
            .limit(1)
            .with_for_update(skip_locked=True, of=EvalJob)
        )
        if job is not None:
            return _claim(session, job, owner)
    return None


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
    return _claimed(job)


def _claimed(job: EvalJob) -> ClaimedJob:
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


def _owned_running(job_id: int, owner: str, attempt: int | None = None) -> ColumnElement[bool]:
    """The job is running under ``owner``, and under the claim ``attempt`` (the fencing token) if given:
    a daemon whose lease ran out and whose job was claimed again (by anyone, itself included) holds an
    older token, so nothing it writes afterwards can touch the new claim."""
    held = and_(EvalJob.id == job_id, EvalJob.state == JobState.RUNNING, EvalJob.claimed_by == owner)
    return held if attempt is None else and_(held, EvalJob.attempts == attempt)


def heartbeat(session: Session, job_id: int, owner: str, attempt: int | None = None) -> bool:
    """Refresh a running job's lease; False if the job is no longer ours (under ``attempt``)."""
    result = session.execute(
        update(EvalJob)
        .where(_owned_running(job_id, owner, attempt))
        .values(heartbeat_at=database_now(session))
    )
    return bool(getattr(result, "rowcount", 0))


def complete_job(
    session: Session,
    *,
    job_id: int,
    owner: str,
    metrics: Sequence[MetricRow],
    samples: Sequence[SampleRow],
    duration_s: float,
    load_s: float | None,
    tp_disagreements: int | None = None,
    problems: Sequence[ProblemRow] = (),
    attempt: int | None = None,
) -> bool:
    """Store a job's results, samples and problems and mark it ``succeeded``: call inside one transaction.

    Returns False (and stores nothing) if the job is no longer running under ``owner`` and the claim
    ``attempt`` (its fencing token): it was requeued after a lost lease and belongs to a newer claim now,
    whose results will count instead.
    """
    job = session.scalar(select(EvalJob).where(_owned_running(job_id, owner, attempt)).with_for_update())
    if job is None:
        return False
    now = utcnow()
    session.add_all(
        Result(job_id=job_id, metric=m.name, value=m.value, n=m.n, stderr=m.stderr, created_at=now)
        for m in metrics
    )
    session.add_all(
        Sample(
            job_id=job_id,
            index=s.index,
            prompt_id=s.prompt_id,
            prompt=s.prompt,
            response=s.response,
            extracted=s.extracted,
            reference=s.reference,
            correct=s.correct,
            tokens=s.tokens,
            truncated=s.truncated,
            reward=s.reward,
            entropy=s.entropy,
            error=s.error,
        )
        for s in samples
    )
    session.add_all(
        SampleProblem(job_id=job_id, where=p.where, message=p.message, prompt_id=p.prompt_id, index=p.index)
        for p in problems
    )
    job.state = JobState.SUCCEEDED
    job.finished_at = now
    job.duration_s = duration_s
    job.load_s = load_s
    job.tp_disagreements = tp_disagreements
    job.problems = len(problems)
    job.error = None
    job.error_kind = None
    # The series this job adds to, for "latest of every run". Daemons sharing a database complete jobs of
    # one series at the same moment: the second insert waits for the first and then does nothing.
    insert = insert_for(session)
    session.execute(
        insert(ResultSeries)
        .from_select(
            ["run_id", "task", "stage"],
            select(Checkpoint.run_id, literal(job.task), literal(job.stage)).where(
                Checkpoint.id == job.checkpoint_id
            ),
        )
        .on_conflict_do_nothing()
    )
    session.flush()
    return True


def fail_job(
    session: Session,
    *,
    job_id: int,
    owner: str,
    kind: str,
    error: str,
    duration_s: float | None,
    retry: bool = False,
    attempt: int | None = None,
) -> bool:
    """Mark a running job ``failed``, or with ``retry`` give it back to the queue to be claimed again
    (its error stays readable until then); False if it is no longer ours under ``attempt``."""
    values: dict[str, Any] = {
        "error_kind": kind,
        "error": error,
        "finished_at": utcnow(),
        "duration_s": duration_s,
    }
    if retry:
        values.update(state=JobState.PENDING, claimed_by=None, heartbeat_at=None)
    else:
        values.update(state=JobState.FAILED)
    result = session.execute(update(EvalJob).where(_owned_running(job_id, owner, attempt)).values(**values))
    return bool(getattr(result, "rowcount", 0))


@dataclass(frozen=True)
class AttemptRow:
    job_id: int
    attempt: int
    engine: str
    tp: int
    dp: int
    batch_size: int
    outcome: str
    error_kind: str | None
    error: str | None
    started_at: datetime
    finished_at: datetime
    duration_s: float
    #: The scheduler's view of a run through Slurm; None for a local worker.
    slurm_job_id: str | None = None
    nodes: str | None = None
    queue_wait_s: float | None = None
    run_s: float | None = None
    exit_state: str | None = None


def record_attempt(session: Session, row: AttemptRow, *, replaces_lost: bool = False) -> None:
    """Add a worker run's history row. ``replaces_lost``: the row a recovering daemon wrote for this
    claim, taking its daemon for dead (``lost``), is this run's, now told by the daemon that ran it
    (alive after all, its lease gone): rewritten, so that one run stays one row."""
    if replaces_lost:
        lost = session.scalar(
            select(JobAttempt)
            .where(
                JobAttempt.job_id == row.job_id,
                JobAttempt.attempt == row.attempt,
                JobAttempt.outcome == "lost",
            )
            .order_by(JobAttempt.id.desc())
            .limit(1)
        )
        if lost is not None:
            for name, value in asdict(row).items():
                setattr(lost, name, value)
            return
    session.add(JobAttempt(**asdict(row)))


def attempt_recorded(session: Session, job_id: int, attempt: int, since: datetime | None = None) -> bool:
    """Whether claim ``attempt`` of the job has a history row already; with ``since`` (the claim's
    start), only a row that ended after it counts: a claim given back at a shutdown is claimed again
    under the same number, and the earlier run's row is not this one's."""
    condition = and_(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt)
    if since is not None:
        condition = and_(condition, JobAttempt.finished_at >= since)
    return session.scalar(select(JobAttempt.id).where(condition).limit(1)) is not None


def job_history(session: Session, job_id: int) -> list[AttemptRow]:
    attempts = session.scalars(select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.id))
    return [
        AttemptRow(
            job_id=a.job_id,
            attempt=a.attempt,
            engine=a.engine,
            tp=a.tp,
            dp=a.dp,
            batch_size=a.batch_size,
            outcome=a.outcome,
            error_kind=a.error_kind,
            error=a.error,
            started_at=a.started_at,
            finished_at=a.finished_at,
            duration_s=a.duration_s,
            slurm_job_id=a.slurm_job_id,
            nodes=a.nodes,
            queue_wait_s=a.queue_wait_s,
            run_s=a.run_s,
            exit_state=a.exit_state,
        )
        for a in attempts
    ]


def record_handle(session: Session, *, job_id: int, owner: str, attempt: int, handle: str | None) -> bool:
    """Record the claim's submission to a scheduler (``Handle.to_json``; None clears it), fenced by the
    claim ``attempt`` like a result; False if the job is no longer ours."""
    result = session.execute(
        update(EvalJob).where(_owned_running(job_id, owner, attempt)).values(executor_handle=handle)
    )
    return bool(getattr(result, "rowcount", 0))


def set_executor_state(session: Session, *, job_id: int, owner: str, attempt: int, state: str) -> bool:
    """Where the scheduler has the claim's submission now (``PENDING (Resources)``), for ``evald status``."""
    result = session.execute(
        update(EvalJob).where(_owned_running(job_id, owner, attempt)).values(executor_state=state)
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
    result = session.execute(update(EvalJob).where(_owned_running(job_id, owner, attempt)).values(**values))
    return bool(getattr(result, "rowcount", 0))


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
    return _claimed(job)


def recover_orphans(
    session: Session, *, lease: timedelta, every_running: bool, keep: Collection[int] = ()
) -> list[int]:
    """Requeue running jobs whose daemon died (see :func:`orphans`); returns their ids."""
    ids = [o.id for o in orphans(session, lease=lease, every_running=every_running, keep=keep)]
    requeue_orphans(session, ids)
    return ids


def mark_checkpoint(session: Session, checkpoint_id: int, state: CheckpointState, reason: str) -> None:
    session.execute(
        update(Checkpoint)
        .where(Checkpoint.id == checkpoint_id)
        .values(state=state, reason=reason, updated_at=utcnow())
    )


def job_state(session: Session, job_id: int) -> JobState | None:
    return session.scalar(select(EvalJob.state).where(EvalJob.id == job_id))
