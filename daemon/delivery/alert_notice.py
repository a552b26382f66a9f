"""What one notice of an alert says: the webhooks' body, and what a tracker's event is made from (live, or
from the stored alert by a backfill)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from daemon.delivery.payload import Event
from storage.models import Alert


def notice_body(
    run: str,
    alert: Alert,
    *,
    ends_at: datetime | None,
    links: Mapping[str, str],
    event: Event | None = None,
) -> dict[str, Any]:
    """What a notice of ``alert`` says (the webhooks' body; a tracker's event is made from it), resolved
    at ``ends_at`` or, None, firing; ``event``: why it is sent (None: it fired, or it resolved)."""
    return {
        "event": event or ("resolved" if ends_at is not None else "fired"),
        "fingerprint": alert.fingerprint,
        "run": run,
        "checkpoint": alert.checkpoint,
        # The step a receiver shows: the onset while it fires, the step that resolved it after.
        "step": alert.resolved_step if ends_at is not None else alert.first_step,
        "first_step": alert.first_step,
        "last_step": alert.last_step,
        "resolved_step": alert.resolved_step if ends_at is not None else None,
        "task": alert.task,
        "metric": alert.metric,
        "rule": alert.rule,
        "value": alert.value,
        "baseline": alert.baseline,
        "best_step": alert.best_step,
        "rollback_step": alert.rollback_step,
        "severity": alert.severity,
        "state": "resolved" if ends_at is not None else "firing",
        "message": alert.message,
        "links": dict(links),
        "starts_at": alert.fired_at.isoformat(),
        "ends_at": None if ends_at is None else ends_at.isoformat(),
    }
