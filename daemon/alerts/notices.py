"""What an alert's receivers are told when a result re-judges its series (pure): the news between the
alert as stored (what its receivers were last told of its episode) and its latest episode now.

The contract, whatever order the results arrive in (newest first, oldest first, a backfill, retries):

- every change of what an alert *is* is sent: a new episode (``fired``, or ``resolved`` when it is already
  over by the time its results are in), the episode ending (``resolved``) or firing again (``fired``);
- a late older result that moves an episode's steps sends exactly one ``updated`` notice carrying them:
  the onset (``first_step``) of a firing alert; the onset, last step and resolving step of a resolved one
  (a closed episode is known whole). Sent at once, cooldown or not, and once for one move. A late result
  that no longer fires inside a firing episode splits it: the onset moves to the part after it, past every
  step told so far, and that too is one ``updated`` (the receivers' alert never stopped firing);
- what only grows while the episode fires (the latest step, its value) is sent as a ``reminder`` after
  ``cooldown_secs``, or at once as ``escalated`` when the severity rose.

So once every result is in, each alert's last notice says what the stored alert says: its state and onset,
and for a resolved alert its last and resolving steps, the same for every arrival order (a firing alert's
latest step is the one of its last notice: reminders are throttled). Steps stored in step order never move
an onset: oldest first sends no ``updated`` notice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from daemon.alerts.episodes import Episode
from daemon.delivery.payload import Event

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Told:
    """The stored alert before this judgement: what its receivers were last told of its episode (every
    change of state and every move of its steps is told; only a firing episode's latest step and value
    run ahead of its last notice until a reminder)."""

    first_step: int | None
    last_step: int | None
    resolved_step: int | None
    firing: bool
    severity: str
    #: When a notice of it was last queued; None: never (an alert stored before evald kept it).
    notified_at: datetime | None


def news(before: Told | None, episode: Episode, *, now: datetime, cooldown: timedelta) -> Event | None:
    """What the alert's receivers are told when its latest episode is ``episode`` and it was ``before``
    (None: no alert yet); None: nothing."""
    if before is None or not episode.overlaps(before.first_step, before.last_step):
        return "fired" if episode.firing else "resolved"
    if before.firing != episode.firing:
        return "fired" if episode.firing else "resolved"
    if moved(before, episode):
        return "updated"
    if not episode.firing:
        return None
    newer = before.last_step is None or episode.last_step > before.last_step
    if not newer:
        return None
    if SEVERITY_RANK[episode.latest.severity] > SEVERITY_RANK.get(before.severity, 0):
        return "escalated"
    if before.notified_at is None or now - before.notified_at >= cooldown:
        return "reminder"
    return None


def moved(before: Told, episode: Episode) -> bool:
    """Whether ``episode`` (the same one) has other steps than its receivers were told: the onset, and for
    a resolved episode its last and resolving steps too."""
    if before.first_step != episode.first_step:
        return True
    if episode.firing:
        return False
    return (before.last_step, before.resolved_step) != (episode.last_step, episode.resolved_step)
