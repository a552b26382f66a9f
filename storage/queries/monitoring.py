"""What ``/metrics`` reads beyond the newest values: how the webhook outbox stands (failed attempts,
messages by state), per endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from storage.models import (
    Delivery,
    OutboxMessage,
    OutboxState,
)


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
