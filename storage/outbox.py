"""Outbox queries: messages queued for delivery, claimed under a lease, their attempts' history, and
endpoints disabled for good.

A message is queued in the transaction that stores what it tells of (an alert's change, a result), so
nothing is stored without being queued, nor queued without being stored; a relay (``daemon.delivery``)
claims and sends them afterwards, as many times as it takes, and records each attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, true, update
from sqlalchemy.orm import Session, aliased

from storage.models import Alert, Delivery, OutboxMessage, OutboxState, WebhookEndpoint, utcnow


def enqueue(
    session: Session, *, alert: Alert, endpoints: Sequence[str], event_ids: Sequence[str], body: str
) -> None:
    """One outbox row per endpoint for this event of ``alert``."""
    now = utcnow()
    session.add_all(
        OutboxMessage(
            alert_id=alert.id,
            run_id=alert.run_id,
            endpoint=endpoint,
            event_id=event_id,
            body=body,
            next_attempt_at=now,
            created_at=now,
        )
        for endpoint, event_id in zip(endpoints, event_ids, strict=True)
    )
    session.flush()


def enqueue_message(
    session: Session,
    *,
    run_id: int,
    endpoint: str,
    event_id: str,
    body: str,
    target: str | None = None,
    legacy_id: str | None = None,
) -> bool:
    """A message that belongs to no alert (a tracker's: endpoint ``tracker:<name>``, for its ``target``),
    keyed by a stable ``event_id``: one already queued (a backfill of what was sent live) is not queued
    twice, nor one queued under ``legacy_id`` (its id before targets were kept) for this target or for
    none. Returns whether it was queued."""
    if session.scalar(select(OutboxMessage.id).where(OutboxMessage.event_id == event_id)) is not None:
        return False
    if legacy_id is not None:
        found = session.scalar(
            select(OutboxMessage.id).where(
                OutboxMessage.event_id == legacy_id,
                or_(OutboxMessage.target.is_(None), OutboxMessage.target == target),
            )
        )
        if found is not None:
            return False
    now = utcnow()
    session.add(
        OutboxMessage(
            alert_id=None,
            run_id=run_id,
            endpoint=endpoint,
            target=target,
            event_id=event_id,
            body=body,
            next_attempt_at=now,
            created_at=now,
        )
    )
    session.flush()
    return True


def adopt(session: Session, *, endpoint: str, target: str) -> int:
    """``endpoint``'s rows queued before targets were kept become ``target``'s (the tracker's target at
    its first start since); returns how many."""
    result = session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.endpoint == endpoint, OutboxMessage.target.is_(None))
        .values(target=target)
    )
    return int(getattr(result, "rowcount", 0))


def other_targets(session: Session, *, endpoint: str, target: str) -> list[str]:
    """The targets other than ``target`` that ``endpoint`` has rows of (it pointed there before)."""
    return list(
        session.scalars(
            select(OutboxMessage.target)
            .where(
                OutboxMessage.endpoint == endpoint,
                OutboxMessage.target.is_not(None),
                OutboxMessage.target != target,
            )
            .distinct()
        )
    )


def known_ids(session: Session, event_ids: Sequence[str], *, target: str | None = None) -> set[str]:
    """Those of ``event_ids`` that are queued (for ``target``, or for none, when given)."""
    found: set[str] = set()
    for i in range(0, len(event_ids), 500):
        query = select(OutboxMessage.event_id).where(OutboxMessage.event_id.in_(event_ids[i : i + 500]))
        if target is not None:
            query = query.where(or_(OutboxMessage.target.is_(None), OutboxMessage.target == target))
        found.update(session.scalars(query))
    return found


@dataclass(frozen=True)
class Due:
    id: int
    endpoint: str
    event_id: str
    body: str
    attempts: int


def due(
    session: Session,
    *,
    endpoint: str,
    now: datetime,
    lease: timedelta = timedelta(seconds=60),
    limit: int = 20,
    target: str | None = None,
) -> list[Due]:
    """Claim the pending messages for ``endpoint`` that may be sent now, in order per run: a run's message
    waits while an older one of the same run is still pending (its receiver sees a run's alerts in order).

    Claimed means moved ``lease`` into the future, under a row lock another daemon's relay skips: daemons
    sharing a PostgreSQL outbox do not both send a message. Commit before sending."""
    reason = disabled(session, endpoint)
    if reason is not None:
        # Rows a result's transaction queued while the endpoint was being disabled: never sent either.
        session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.endpoint == endpoint, OutboxMessage.state == OutboxState.PENDING)
            .values(state=OutboxState.DISABLED, last_error=reason)
        )
        return []
    oldest = _heads(endpoint, target)
    rows = session.scalars(
        select(OutboxMessage)
        .join(oldest, and_(OutboxMessage.id == oldest.c.first))
        .where(OutboxMessage.next_attempt_at <= now)
        .order_by(OutboxMessage.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=OutboxMessage)
    ).all()
    for row in rows:
        row.next_attempt_at = now + lease
    return [Due(r.id, endpoint, r.event_id, r.body, r.attempts) for r in rows]


def due_many(
    session: Session,
    *,
    endpoint: str,
    now: datetime,
    lease: timedelta,
    limit: int,
    target: str | None = None,
) -> list[Due]:
    """Claim up to ``limit`` pending messages for ``endpoint`` in one transaction, several of a run at once
    (a tracker's batch), each run's in the order queued: a run takes part only while its oldest pending
    message is due, so one claimed by another relay, or backing off, holds back the run's later ones.

    Claimed as ``due`` claims (moved ``lease`` into the future, rows locked, others skip them). The
    webhooks' relay keeps to ``due``: one message per run in flight. ``target``: only its rows (a tracker's
    rows for where it pointed before wait for it to point there again)."""
    if disabled(session, endpoint) is not None:
        return due(session, endpoint=endpoint, now=now, lease=lease, limit=limit, target=target)
    heads = _heads(endpoint, target)
    head = aliased(OutboxMessage)
    rows = session.scalars(
        select(OutboxMessage)
        .join(heads, OutboxMessage.run_id == heads.c.run_id)
        .join(head, head.id == heads.c.first)
        .where(
            OutboxMessage.endpoint == endpoint,
            _of_target(target),
            OutboxMessage.state == OutboxState.PENDING,
            OutboxMessage.next_attempt_at <= now,
            head.next_attempt_at <= now,
        )
        .order_by(OutboxMessage.id)
        .limit(limit)
        .with_for_update(skip_locked=True, of=OutboxMessage)
    ).all()
    ids = [r.id for r in rows]
    if ids:
        session.execute(
            update(OutboxMessage).where(OutboxMessage.id.in_(ids)).values(next_attempt_at=now + lease)
        )
    return [Due(r.id, endpoint, r.event_id, r.body, r.attempts) for r in rows]


def _of_target(target: str | None) -> Any:
    return true() if target is None else OutboxMessage.target == target


def _heads(endpoint: str, target: str | None = None) -> Any:
    """Each run's oldest pending message for ``endpoint`` (and ``target``): the only one of the run that
    may be sent."""
    return (
        select(OutboxMessage.run_id, func.min(OutboxMessage.id).label("first"))
        .where(
            OutboxMessage.endpoint == endpoint,
            _of_target(target),
            OutboxMessage.state == OutboxState.PENDING,
        )
        .group_by(OutboxMessage.run_id)
        .subquery()
    )


def next_due_at(session: Session, *, endpoint: str, target: str | None = None) -> datetime | None:
    """When the next message ``due`` would hand out becomes due (None: nothing to send)."""
    if disabled(session, endpoint) is not None:
        return None
    heads = _heads(endpoint, target)
    return session.scalar(
        select(func.min(OutboxMessage.next_attempt_at)).join(heads, OutboxMessage.id == heads.c.first)
    )


@dataclass(frozen=True)
class Attempt:
    started_at: datetime
    duration_s: float
    status_code: int | None
    error: str | None
    retry_after_s: float | None = None


def record_attempt(session: Session, message_id: int, attempt: Attempt) -> int:
    """Keep the attempt in the history; returns its number."""
    message = session.get(OutboxMessage, message_id, with_for_update=True)
    assert message is not None
    message.attempts += 1
    session.add(
        Delivery(
            outbox_id=message_id,
            attempt=message.attempts,
            started_at=attempt.started_at,
            duration_s=attempt.duration_s,
            status_code=attempt.status_code,
            error=attempt.error,
            retry_after_s=attempt.retry_after_s,
        )
    )
    return message.attempts


def record_attempts(session: Session, message_ids: Sequence[int], attempt: Attempt) -> int:
    """``record_attempt`` for several messages that went in one call (one history row each); returns the
    highest attempt number among them."""
    if not message_ids:
        return 0
    counts = dict(
        session.execute(
            select(OutboxMessage.id, OutboxMessage.attempts)
            .where(OutboxMessage.id.in_(message_ids))
            .with_for_update()
        ).all()
    )
    session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.id.in_(message_ids))
        .values(attempts=OutboxMessage.attempts + 1)
    )
    session.add_all(
        Delivery(
            outbox_id=message_id,
            attempt=counts[message_id] + 1,
            started_at=attempt.started_at,
            duration_s=attempt.duration_s,
            status_code=attempt.status_code,
            error=attempt.error,
            retry_after_s=attempt.retry_after_s,
        )
        for message_id in message_ids
    )
    return max(counts.values()) + 1


def delivered_many(session: Session, message_ids: Sequence[int]) -> None:
    """Several messages delivered, marked in the caller's one transaction."""
    if message_ids:
        session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id.in_(message_ids))
            .values(state=OutboxState.DELIVERED, delivered_at=utcnow(), last_error=None)
        )


#: How a pending message's last error starts while its route is paused (its credentials were refused):
#: ``evald status`` says paused, and why, from it.
PAUSED = "paused: "


def paused_error(why: str) -> str:
    """The last error a message keeps while its route is paused because of ``why``."""
    return f"{PAUSED}{why}"


def pause_reason(error: str | None) -> str | None:
    """Why the route of a message whose last error is ``error`` is paused; None where it is not."""
    if error is None or not error.startswith(PAUSED):
        return None
    return error[len(PAUSED) :]


def retry_now(session: Session, *, endpoint: str, target: str | None, now: datetime) -> int:
    """``endpoint``'s pending messages (of ``target``, None: all) that wait out a back-off or a pause,
    due ``now`` and no longer marked paused: what could fix the refusal changed (the tracker's settings,
    the daemon's environment at a start). Returns how many. A message not tried yet is left alone: one
    due later than now is claimed for its first try (a lease held by a relay)."""
    waiting = and_(
        OutboxMessage.endpoint == endpoint,
        _of_target(target),
        OutboxMessage.state == OutboxState.PENDING,
        OutboxMessage.attempts > 0,
        OutboxMessage.next_attempt_at > now,
    )
    result = session.execute(update(OutboxMessage).where(waiting).values(next_attempt_at=now))
    session.execute(
        update(OutboxMessage)
        .where(
            OutboxMessage.endpoint == endpoint,
            _of_target(target),
            OutboxMessage.state == OutboxState.PENDING,
            OutboxMessage.last_error.startswith(PAUSED, autoescape=True),
        )
        .values(last_error=func.substr(OutboxMessage.last_error, len(PAUSED) + 1))
    )
    return int(getattr(result, "rowcount", 0))


def retry_many_at(session: Session, message_ids: Sequence[int], when: datetime, error: str) -> None:
    if message_ids:
        session.execute(
            update(OutboxMessage)
            .where(OutboxMessage.id.in_(message_ids))
            .values(next_attempt_at=when, last_error=error)
        )


def delivered(session: Session, message_id: int) -> None:
    session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.id == message_id)
        .values(state=OutboxState.DELIVERED, delivered_at=utcnow(), last_error=None)
    )


def give_up(session: Session, message_id: int, error: str) -> None:
    """The endpoint refuses this message for good (or it cannot be rendered): it stops blocking its run."""
    session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.id == message_id)
        .values(state=OutboxState.FAILED, last_error=error)
    )


def disable_endpoint(session: Session, endpoint: str, reason: str) -> int:
    """Stop sending to ``endpoint``: its pending messages become ``disabled``; returns how many."""
    standing = session.get(WebhookEndpoint, endpoint, with_for_update=True)
    if standing is None:
        standing = WebhookEndpoint(name=endpoint)
        session.add(standing)
    standing.disabled_at = utcnow()
    standing.disabled_reason = reason
    result = session.execute(
        update(OutboxMessage)
        .where(OutboxMessage.endpoint == endpoint, OutboxMessage.state == OutboxState.PENDING)
        .values(state=OutboxState.DISABLED, last_error=reason)
    )
    return int(getattr(result, "rowcount", 0))


def disabled(session: Session, endpoint: str) -> str | None:
    """Why ``endpoint`` is disabled, or None."""
    standing = session.get(WebhookEndpoint, endpoint)
    if standing is None or standing.disabled_at is None:
        return None
    return standing.disabled_reason or "disabled"


def enable_endpoint(session: Session, endpoint: str) -> None:
    """A changed endpoint config is a new chance (the operator fixed the URL)."""
    standing = session.get(WebhookEndpoint, endpoint)
    if standing is not None:
        standing.disabled_at = None
        standing.disabled_reason = None
