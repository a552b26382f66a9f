"""What ``/metrics`` reads beyond the newest values: when each run and task last got a result, and how the
webhook outbox stands (failed attempts, messages by state), per endpoint."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from storage.models import (
    Checkpoint,
    Delivery,
    EvalJob,
    JobState,
    OutboxMessage,
    OutboxState,
    Run,
)


@dataclass(frozen=True)
class LastResult:
    run: str
    task: str
    #: When the newest succeeded job of (run, task) finished: its results were stored then.
    at: datetime


def last_results(session: Session) -> list[LastResult]:
    """Per (run, task), the finish time of its newest succeeded job, by run and task."""
    query = (
        select(Run.name, EvalJob.task, func.max(EvalJob.finished_at))
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .where(EvalJob.state == JobState.SUCCEEDED, EvalJob.finished_at.is_not(None))
        .group_by(Run.name, EvalJob.task)
        .order_by(Run.name, EvalJob.task)
    )
    return [LastResult(run, task, _utc(at)) for run, task, at in session.execute(query) if at is not None]


@dataclass(frozen=True)
class EndpointStanding:
    endpoint: str
    #: Attempts that did not deliver: no answer (timeout, connection refused) or a non-2xx status.
    failed_attempts: int
    #: Outbox messages by state (pending, delivered, disabled, failed), zeros included.
    messages: dict[str, int]


def webhook_standing(session: Session, endpoints: tuple[str, ...] = ()) -> list[EndpointStanding]:
    """Every endpoint the outbox or ``endpoints`` (the configured ones) names, by name."""
    failed = or_(Delivery.status_code.is_(None), Delivery.status_code < 200, Delivery.status_code >= 300)
    failures = dict(
        session.execute(
            select(OutboxMessage.endpoint, func.count(Delivery.id))
            .join(OutboxMessage, Delivery.outbox_id == OutboxMessage.id)
            .where(failed)
            .group_by(OutboxMessage.endpoint)
        ).all()
    )
    messages: dict[str, dict[str, int]] = {}
    counts = session.execute(
        select(OutboxMessage.endpoint, OutboxMessage.state, func.count()).group_by(
            OutboxMessage.endpoint, OutboxMessage.state
        )
    )
    for endpoint, state, count in counts:
        messages.setdefault(endpoint, {})[OutboxState(state).value] = int(count)
    names = sorted({*endpoints, *failures, *messages})
    return [
        EndpointStanding(
            name,
            int(failures.get(name, 0)),
            {s.value: messages.get(name, {}).get(s.value, 0) for s in OutboxState},
        )
        for name in names
    ]


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC); PostgreSQL aware ones.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
