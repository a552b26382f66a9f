"""How the outbox stands, per endpoint: what ``/metrics`` reads beyond the newest values (failed attempts,
messages by state), and each tracker's backlog as ``evald status`` shows it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from storage import outbox
from storage.models import (
    Delivery,
    OutboxMessage,
    OutboxState,
    WebhookEndpoint,
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


@dataclass(frozen=True)
class OutboxBacklog:
    """What one outbox endpoint (a tracker's ``tracker:<name>``), for one target, has not delivered yet,
    and why."""

    endpoint: str
    #: Messages waiting to be sent (state ``pending``), and when the oldest of them was queued.
    pending: int
    oldest_pending_at: datetime | None
    #: When the relay tries next: the soonest ``next_attempt_at`` of a run's oldest pending message (a
    #: run's later messages wait behind it, whatever their own time says); None: nothing pending.
    next_attempt_at: datetime | None
    #: The last error of a pending message (the one tried most often): set while deliveries fail.
    last_error: str | None
    #: How many times that message was tried.
    attempts: int
    #: Messages delivered, refused for good (``failed``) and dropped with a disabled endpoint.
    delivered: int
    failed: int
    disabled: int
    last_delivered_at: datetime | None
    #: Why the endpoint is disabled (it answered 410 Gone); None while it is not.
    disabled_reason: str | None = None
    #: Where the rows go (a tracker's target key, where the outbox keeps one); None: not kept.
    target: str | None = None
    #: When the pause its refused credentials began ends (the latest ``next_attempt_at`` of a pending
    #: message marked paused): its relay claims nothing before, whatever else is due; None: not paused.
    paused_until: datetime | None = None


def outbox_backlog(session: Session, prefix: str) -> list[OutboxBacklog]:
    """Every (endpoint, target) whose endpoint starts with ``prefix`` and that has outbox rows, and every
    such endpoint disabled, by name: one grouped pass over the outbox, then the most-tried pending
    message's error of each that has pending messages. Where the outbox keeps no target (before it
    did), each endpoint is one entry with target None."""
    # Read only where the schema has it: the rest of the standing does not depend on it.
    target = getattr(OutboxMessage, "target", None)
    keys: list[Any] = [OutboxMessage.endpoint] if target is None else [OutboxMessage.endpoint, target]
    mine = OutboxMessage.endpoint.startswith(prefix, autoescape=True)
    grouped = session.execute(
        select(
            *keys,
            OutboxMessage.state,
            func.count(),
            func.min(OutboxMessage.created_at),
            func.max(OutboxMessage.delivered_at),
        )
        .where(mine)
        .group_by(*keys, OutboxMessage.state)
    )
    counts: dict[tuple[str, str | None], dict[str, int]] = {}
    oldest: dict[tuple[str, str | None], datetime | None] = {}
    delivered_at: dict[tuple[str, str | None], datetime | None] = {}
    for row in grouped:
        key = (row[0], row[1] if target is not None else None)
        state, count, created, delivered = row[len(keys) :]
        counts.setdefault(key, {})[OutboxState(state).value] = int(count)
        if OutboxState(state) is OutboxState.PENDING:
            oldest[key] = _utc(created)
        if OutboxState(state) is OutboxState.DELIVERED:
            delivered_at[key] = _utc(delivered)
    next_at, paused = _next_tries(session, keys, mine), _pauses(session, keys, mine)
    standing = _disabled(session, prefix)
    for name in standing:
        if not any(endpoint == name for endpoint, _ in counts):
            counts[(name, None)] = {}
    found = []
    for key in sorted(counts, key=lambda k: (k[0], k[1] or "")):
        endpoint, of_target = key
        states = counts[key]
        pending = states.get(OutboxState.PENDING.value, 0)
        error, attempts = _most_tried(session, endpoint, target, of_target) if pending else (None, 0)
        found.append(
            OutboxBacklog(
                endpoint=endpoint,
                pending=pending,
                oldest_pending_at=oldest.get(key),
                next_attempt_at=next_at.get(key),
                last_error=error,
                attempts=attempts,
                delivered=states.get(OutboxState.DELIVERED.value, 0),
                failed=states.get(OutboxState.FAILED.value, 0),
                disabled=states.get(OutboxState.DISABLED.value, 0),
                last_delivered_at=delivered_at.get(key),
                disabled_reason=standing.get(endpoint),
                target=of_target,
                paused_until=paused.get(key) if pending else None,
            )
        )
    return found


#: An outbox row's (endpoint, target): the key of one backlog.
Key = tuple[str, str | None]


def _next_tries(session: Session, keys: list[Any], mine: Any) -> dict[Key, datetime | None]:
    """(endpoint, target) → when its relay tries next: the soonest due of each run's oldest pending
    message (``outbox.due`` sends a run's messages in order, so the later ones wait behind it)."""
    heads = (
        select(*keys, func.min(OutboxMessage.id).label("first"))
        .where(mine, OutboxMessage.state == OutboxState.PENDING)
        .group_by(*keys, OutboxMessage.run_id)
        .subquery()
    )
    columns = [heads.c[k.key] for k in keys]
    soonest = session.execute(
        select(*columns, func.min(OutboxMessage.next_attempt_at))
        .join(OutboxMessage, OutboxMessage.id == heads.c.first)
        .group_by(*columns)
    )
    return {(row[0], row[1] if len(keys) > 1 else None): _utc(row[len(keys)]) for row in soonest}


def _pauses(session: Session, keys: list[Any], mine: Any) -> dict[Key, datetime | None]:
    """(endpoint, target) → when its pause ends: the latest due of its pending messages marked paused."""
    ends = session.execute(
        select(*keys, func.max(OutboxMessage.next_attempt_at))
        .where(
            mine,
            OutboxMessage.state == OutboxState.PENDING,
            OutboxMessage.last_error.startswith(outbox.PAUSED, autoescape=True),
        )
        .group_by(*keys)
    )
    return {(row[0], row[1] if len(keys) > 1 else None): _utc(row[len(keys)]) for row in ends}


def _disabled(session: Session, prefix: str) -> dict[str, str]:
    """Endpoints starting with ``prefix`` that are disabled for good, with why."""
    return {
        name: reason or "disabled"
        for name, reason in session.execute(
            select(WebhookEndpoint.name, WebhookEndpoint.disabled_reason).where(
                WebhookEndpoint.name.startswith(prefix, autoescape=True),
                WebhookEndpoint.disabled_at.is_not(None),
            )
        )
    }


def _most_tried(
    session: Session, endpoint: str, target: Any, of_target: str | None
) -> tuple[str | None, int]:
    """The last error and attempts of the most-tried pending message of ``endpoint`` (and ``of_target``
    where the outbox keeps targets: ``target`` is its column, else None); (None, 0) when none was tried."""
    query = (
        select(OutboxMessage.last_error, OutboxMessage.attempts)
        .where(
            OutboxMessage.endpoint == endpoint,
            OutboxMessage.state == OutboxState.PENDING,
            OutboxMessage.attempts > 0,
        )
        .order_by(OutboxMessage.attempts.desc(), OutboxMessage.id)
        .limit(1)
    )
    if target is not None:
        query = query.where(target.is_(None) if of_target is None else target == of_target)
    tried = session.execute(query).first()
    return (None, 0) if tried is None else (tried[0], int(tried[1]))


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; they were stored as UTC.
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value
