"""Where every checkpoint and job stands: what ``evald status`` and the HTTP API list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import accumulate

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, aliased

from storage.models import Alert, Checkpoint, EvalJob, JobState, Result, ResultSeries, Run
from storage.queries.latest import series_newest_step


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
    #: The daemon (``host:pid``) that holds a running job, and its last sign of life.
    claimed_by: str | None = None
    heartbeat_at: datetime | None = None
    started_at: datetime | None = None
    #: A running job handed to a scheduler: where the scheduler has it (``PENDING (Resources)``,
    #: ``RUNNING on node1``) as the daemon last saw it; None for a local worker or not seen yet.
    executor_state: str | None = None


@dataclass(frozen=True)
class RunRow:
    name: str
    root: str
    created_at: datetime
    #: Checkpoints recorded, in any state.
    checkpoints: int
    #: The newest step among them (None: none has a step yet).
    latest_step: int | None
    #: The newest step a job succeeded on (None: nothing evaluated yet).
    evaluated_step: int | None


def run_rows(session: Session, name: str | None = None) -> list[RunRow]:
    """Every run (or the one named) with its checkpoint count and newest recorded and evaluated steps.

    Each figure is a subquery per run on ``ix_checkpoints_run_step``: the newest evaluated step is the
    newest of the run's series (``result_series``), each walked back from the newest checkpoint to the
    first succeeded job, instead of grouping every job of every run (1.2 s against ~0.1 s for the
    dashboard's run list on 100 runs x 1,000 checkpoints). Walking back on the job's state alone let
    SQLite go through every succeeded job of the database per run (30 ms each at 100,000 jobs).
    """
    count = select(func.count()).where(Checkpoint.run_id == Run.id).correlate(Run).scalar_subquery()
    latest = (
        select(func.max(Checkpoint.step)).where(Checkpoint.run_id == Run.id).correlate(Run).scalar_subquery()
    )
    series = aliased(ResultSeries)
    evaluated = (
        select(func.max(series_newest_step(series)))
        .where(series.run_id == Run.id)
        .correlate(Run)
        .scalar_subquery()
    )
    query = select(Run.name, Run.root, Run.created_at, count, latest, evaluated).order_by(Run.name)
    if name is not None:
        query = query.where(Run.name == name)
    return [
        RunRow(name=n, root=r, created_at=c, checkpoints=k or 0, latest_step=ls, evaluated_step=es)
        for n, r, c, k, ls, es in session.execute(query)
    ]


def checkpoint_rows(
    session: Session, run: str | None = None, *, limit: int | None = None, offset: int = 0
) -> list[CheckpointRow]:
    query = (
        select(
            Run.name, Checkpoint.name, Checkpoint.path, Checkpoint.step, Checkpoint.state, Checkpoint.reason
        )
        .join(Run, Checkpoint.run_id == Run.id)
        .order_by(Run.name, Checkpoint.step, Checkpoint.name, Checkpoint.id)
    )
    if run is not None:
        query = query.where(Run.name == run)
    if offset:
        query = query.offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return [
        CheckpointRow(run=r, name=n, path=p, step=s, state=str(st.value), reason=reason)
        for r, n, p, s, st, reason in session.execute(query)
    ]


def job_rows(session: Session, run: str | None = None, *, step: int | None = None) -> list[JobRow]:
    """Every job (of ``run``, at ``step``), its error whole: renderings cut it (``evald status`` shows
    the first line, which says what went wrong; the lines below it are the worker's log tail)."""
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
            EvalJob.claimed_by,
            EvalJob.heartbeat_at,
            EvalJob.started_at,
            EvalJob.executor_state,
        )
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .order_by(Run.name, Checkpoint.step, EvalJob.task, EvalJob.stage)
    )
    if run is not None:
        query = query.where(Run.name == run)
    if step is not None:
        query = query.where(EvalJob.step == step)
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
            claimed_by=o if st is JobState.RUNNING else None,
            heartbeat_at=_utc(h) if st is JobState.RUNNING else None,
            started_at=_utc(sa),
            executor_state=x if st is JobState.RUNNING else None,
        )
        for i, r, c, s, t, sg, st, a, e, p, w, k, d, n, o, h, sa, x in session.execute(query)
    ]


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; they were stored as UTC.
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def change_marks(session: Session) -> tuple[int, int, int]:
    """Numbers that move whenever a result is stored or an alert fires or resolves: a page polls these
    every few seconds and reloads its data only when they moved. Each is a lookup on a primary key or on
    the small alerts table, never a scan of the results or jobs."""
    row = session.execute(
        select(
            select(func.max(Result.id)).scalar_subquery(),
            select(func.max(Alert.id)).scalar_subquery(),
            select(func.count()).select_from(Alert).where(Alert.resolved_at.is_not(None)).scalar_subquery(),
        )
    ).one()
    return (int(row[0] or 0), int(row[1] or 0), int(row[2] or 0))


def job_state_counts(session: Session) -> dict[str, int]:
    """Jobs by state, every state listed (0 when none): the queue depth ``evald_jobs`` exports."""
    counts: dict[JobState, int] = {
        state: count
        for state, count in session.execute(select(EvalJob.state, func.count()).group_by(EvalJob.state))
    }
    return {state.value: int(counts.get(state, 0)) for state in JobState}


@dataclass(frozen=True)
class DurationBuckets:
    """Finished jobs of one (task, state) counted into cumulative duration buckets."""

    task: str
    state: str
    #: Jobs that took at most each bound, in the bounds' order (cumulative, as Prometheus wants).
    cumulative: tuple[int, ...]
    count: int
    total_s: float


def job_durations(session: Session, bounds: Sequence[float]) -> list[DurationBuckets]:
    """Durations of succeeded and failed jobs, counted into ``bounds`` by the database (a few rows per
    (task, state), however many jobs): the ``evald_job_duration_seconds`` histogram.

    The database puts each job in its first bucket (one CASE per row, about a quarter cheaper than a sum
    per bound over 100 k jobs); the counts are made cumulative here."""
    bucket = case(
        *[(EvalJob.duration_s <= bound, number) for number, bound in enumerate(bounds)], else_=len(bounds)
    ).label("bucket")
    query = (
        select(EvalJob.task, EvalJob.state, bucket, func.count(), func.sum(EvalJob.duration_s))
        .where(EvalJob.state.in_((JobState.SUCCEEDED, JobState.FAILED)), EvalJob.duration_s.is_not(None))
        .group_by(EvalJob.task, EvalJob.state, bucket)
    )
    counted: dict[tuple[str, str], list[int]] = {}
    totals: dict[tuple[str, str], float] = {}
    for task, state, number, count, total in session.execute(query):
        key = (task, JobState(state).value)
        counted.setdefault(key, [0] * (len(bounds) + 1))[int(number)] += int(count)
        totals[key] = totals.get(key, 0.0) + float(total or 0.0)
    found = []
    for (task, state), per_bucket in sorted(counted.items()):
        cumulative = tuple(accumulate(per_bucket[: len(bounds)]))
        found.append(DurationBuckets(task, state, cumulative, sum(per_bucket), totals[(task, state)]))
    return found
