"""How each tracker's deliveries stand, as ``evald status`` and ``/api/v1/status`` show it: the backlog
(messages waiting, the oldest's age), and whether its deliveries fail (the last error, the next try)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from daemon.analysis.report.cells import duration, first_line, jsonable
from storage.outbox import pause_reason

if TYPE_CHECKING:
    from storage.queries.monitoring import OutboxBacklog

#: A character a tracker's name may hold: an endpoint that goes on with one of these is another name's.
_NAME_CHAR = re.compile(r"[A-Za-z0-9._-]")
#: How much of a tracker's last error the text status shows.
TRACKER_ERROR_CHARS = 160
#: What ends a pause before its time, said under a paused tracker.
RESUME_HINT = (
    "tried at once after a restart, or a reload that changes this tracker's table (token_env, user_env, "
    "tracking_uri, ...)"
)


@dataclass(frozen=True)
class TrackerRef:
    """A configured tracker as the standing needs it (no config type in this pure module)."""

    name: str
    kind: str
    #: Its outbox endpoint (``tracker:<name>``).
    endpoint: str
    #: The key of where it sends now (its server and experiment, project, folder); None: not kept.
    target: str | None = None


def _belongs(endpoint: str, tracker: TrackerRef) -> bool:
    """Whether the outbox's ``endpoint`` holds ``tracker``'s rows: its own name, or its name followed by
    what a keying by target adds (``tracker:mlflow@<target>``), never another name that starts alike."""
    if endpoint == tracker.endpoint:
        return True
    if not endpoint.startswith(tracker.endpoint):
        return False
    return not _NAME_CHAR.match(endpoint[len(tracker.endpoint)])


def trackers(
    configured: Sequence[TrackerRef], backlogs: Sequence[OutboxBacklog], now: datetime
) -> list[dict[str, Any]]:
    """One entry per configured tracker (its rows under every endpoint that is its, for where it sends
    now), then one per endpoint no configured tracker owns that still has messages waiting (a tracker
    removed or renamed): ``state`` is ``up to date``, ``sending`` (a backlog, no error), ``failing`` (its
    deliveries fail: the last error and the next try), ``paused`` (its credentials were refused: the
    refusal and the try at the pause's end) or ``disabled``. A tracker's rows kept for where it
    pointed before (another target) are not sent while it points elsewhere: ``earlier_targets`` counts
    them, apart from its backlog."""
    out = []
    taken: set[str] = set()
    for tracker in configured:
        mine = [b for b in backlogs if _belongs(b.endpoint, tracker)]
        taken.update(b.endpoint for b in mine)
        now_sent = [b for b in mine if _current(b, tracker)]
        standing = _standing(tracker.name, tracker.kind, now_sent, now, configured=True)
        standing["earlier_targets"] = [
            {"target": b.target, "pending": b.pending, "delivered": b.delivered}
            for b in mine
            if not _current(b, tracker)
        ]
        out.append(standing)
    for backlog in backlogs:
        if backlog.endpoint not in taken and backlog.pending:
            name = backlog.endpoint.split(":", 1)[-1]
            out.append(_standing(name, None, [backlog], now, configured=False))
    return out


def _current(backlog: OutboxBacklog, tracker: TrackerRef) -> bool:
    """Rows the tracker sends now: of its target, or kept with none (queued before targets were kept,
    which the tracker takes as its own)."""
    return tracker.target is None or backlog.target is None or backlog.target == tracker.target


def _standing(
    name: str, kind: str | None, mine: Sequence[OutboxBacklog], now: datetime, *, configured: bool
) -> dict[str, Any]:
    pending = sum(b.pending for b in mine)
    oldest = min((b.oldest_pending_at for b in mine if b.oldest_pending_at is not None), default=None)
    upcoming = min((b.next_attempt_at for b in mine if b.pending and b.next_attempt_at), default=None)
    # Paused, its relay claims nothing until the pause ends, whatever else is due.
    upcoming = max((b.paused_until for b in mine if b.paused_until), default=upcoming)
    delivered_at = max((b.last_delivered_at for b in mine if b.last_delivered_at is not None), default=None)
    tried = max(mine, key=lambda b: (b.last_error is not None, b.attempts), default=None)
    error = tried.last_error if tried is not None else None
    refused = pause_reason(error)
    disabled = next((b.disabled_reason for b in mine if b.disabled_reason), None)
    if disabled is not None:
        state = "disabled"
    elif pending and refused is not None:
        state, error = "paused", refused
    elif pending and error is not None:
        state = "failing"
    elif pending:
        state = "sending"
    else:
        state = "up to date"
    return {
        "name": name,
        "kind": kind,
        "configured": configured,
        "endpoints": sorted({b.endpoint for b in mine}),
        "state": state,
        "pending": pending,
        "oldest_pending_at": jsonable(oldest),
        "oldest_pending_age_s": None if oldest is None else _age(oldest, now),
        "next_attempt_at": jsonable(upcoming),
        "next_attempt_in_s": None if upcoming is None else round(-_age(upcoming, now), 1),
        "last_error": error if pending else None,
        "attempts": tried.attempts if tried is not None and pending else 0,
        "delivered": sum(b.delivered for b in mine),
        "last_delivered_at": jsonable(delivered_at),
        "failed": sum(b.failed for b in mine),
        "dropped": sum(b.disabled for b in mine),
        "disabled_reason": disabled,
    }


def _age(when: datetime, now: datetime) -> float:
    if when.tzinfo is None or now.tzinfo is None:
        when, now = when.replace(tzinfo=None), now.replace(tzinfo=None)
    return round((now - when).total_seconds(), 1)


def trackers_text(standing: Sequence[dict[str, Any]]) -> str:
    """``evald status``'s lines on the trackers: one per tracker, its error below it when failing, and
    what waits for where it pointed before."""
    if not standing:
        return ""
    lines = ["trackers:"]
    for tracker in standing:
        lines.extend(_tracker_lines(tracker))
        earlier = _earlier(tracker)
        if earlier is not None:
            lines.append(earlier)
    return "\n".join(lines)


def _tracker_lines(tracker: dict[str, Any]) -> list[str]:
    what = (
        f"{tracker['name']} ({tracker['kind']})"
        if tracker["configured"]
        else f"{tracker['name']} (not in the config: {', '.join(tracker['endpoints'])})"
    )
    given_up = f", {tracker['failed']} refused for good" if tracker["failed"] else ""
    if tracker["state"] == "up to date":
        last = tracker["last_delivered_at"]
        said = f"up to date, {tracker['delivered']} delivered" + (f" (last at {last})" if last else "")
        return [f"  {what}: {said}{given_up}"]
    if tracker["state"] == "disabled":
        return [
            f"  {what}: disabled ({tracker['disabled_reason']}): {tracker['dropped']} dropped, "
            f"{tracker['pending']} pending"
        ]
    age = tracker["oldest_pending_age_s"]
    backlog = f"{tracker['pending']} pending" + ("" if age is None else f", oldest {duration(age)} old")
    if tracker["state"] == "sending":
        return [f"  {what}: sending: {backlog}{given_up}"]
    upcoming = tracker["next_attempt_in_s"]
    when = "now" if upcoming is None or upcoming <= 0 else f"in {duration(upcoming)}"
    error, more = first_line(tracker["last_error"] or "", TRACKER_ERROR_CHARS)
    rest = f" ({more} more line{'s' if more > 1 else ''} in --format json)" if more else ""
    tried = f"tried {tracker['attempts']} time(s), next try {when}"
    if tracker["state"] == "paused":
        head = f"  {what}: PAUSED (credentials refused): {backlog}; {tried}{given_up}"
        return [head, f"    refused: {error}{rest}", f"    {RESUME_HINT}"]
    return [f"  {what}: FAILING: {backlog}; {tried}{given_up}", f"    last error: {error}{rest}"]


def _earlier(tracker: dict[str, Any]) -> str | None:
    """The line on a tracker's rows for where it pointed before, if any wait there."""
    earlier = tracker.get("earlier_targets") or []
    waiting = sum(e["pending"] for e in earlier)
    if not waiting:
        return None
    return (
        f"    earlier target(s): {waiting} message(s) wait for where it pointed before "
        f"({len(earlier)} target(s)); sent only if it points there again"
    )
