"""The sink protocol: deliver one message to a tracker, idempotently, by its stable id.

The relay (``daemon/trackers/relay.py``) claims a message from the outbox, hands it to the sink, and marks
it delivered only when ``deliver`` returned; a sink raises one of the errors below to say what to do
instead. Since a crash can fall between a sink's write and the outbox's mark, each sink also remembers
what it delivered (in the tracker itself where it can), so a message sent again is logged once.
"""

from __future__ import annotations

from typing import Protocol

from daemon.trackers.messages import ResultMessage


class TrackerError(Exception):
    """A delivery that did not happen."""


class TrackerUnavailable(TrackerError):
    """Down, unreachable, slow or answering 5xx: try again after a backoff; nothing is lost."""


class TrackerRefused(TrackerError):
    """The credentials were refused (401/403): the sink pauses; evaluation goes on, messages wait."""


class TrackerRejected(TrackerError):
    """This message can never be taken (malformed for the tracker): given up, so it stops blocking."""


class Sink(Protocol):
    name: str

    def deliver(self, event_id: str, message: ResultMessage) -> bool:
        """Log ``message`` (known by ``event_id``); returns False when it had been delivered already."""
        ...

    def where(self, run: str) -> str:
        """Where ``run``'s results go, for a person (a URL, a folder)."""
        ...

    def close(self) -> None: ...
