"""How a claim ended, recorded: its results stored (``succeeded``), its failure or retry, and its
history row (one per worker run).

Each write is fenced by the claim (:func:`storage.queries.claims.owned_running`): the end of a claim that
is no longer the job's stores nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, literal, select, update
from sqlalchemy.orm import Session

from storage.database import insert_for
from storage.models import (
    Checkpoint,
    EvalJob,
    JobAttempt,
    JobState,
    Result,
    ResultSeries,
    Sample,
    SampleProblem,
    utcnow,
)
from storage.queries.claims import owned_running
from storage.queries.results import MetricRow
from storage.queries.samples import ProblemRow, SampleRow


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
    job = session.scalar(select(EvalJob).where(owned_running(job_id, owner, attempt)).with_for_update())
    if job is None:
        return False
    now = utcnow()
    session.add_all(
        Result(job_id=job_id, metric=m.name, value=m.value, n=m.n, stderr=m.stderr, created_at=now)
        for m in metrics
    )
    # SampleRow's fields are the samples table's columns: one list of them, in SampleRow.
    session.add_all(Sample(job_id=job_id, **asdict(s)) for s in samples)
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
    result = session.execute(update(EvalJob).where(owned_running(job_id, owner, attempt)).values(**values))
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
