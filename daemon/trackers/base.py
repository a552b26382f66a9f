"""The sink protocol: deliver a batch of messages to a tracker, idempotently, by their stable ids.

The relay (``daemon/trackers/relay.py``) claims a tracker's due messages from the outbox (many in one
transaction), hands them to the sink in one ``deliver_many``, and marks delivered, in one transaction, those
the sink says it delivered; a sink stops at the first message it could not deliver and says why with one
of the errors below. Since a crash can fall between a sink's write and the outbox's mark, each sink also
remembers what it delivered (in the tracker itself where it can), so a message sent again is logged once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from daemon.trackers.messages import Message


class TrackerError(Exception):
    """A delivery that did not happen."""


class TrackerUnavailable(TrackerError):
    """Down, unreachable, slow or answering 5xx: try again after a backoff; nothing is lost."""


class TrackerRefused(TrackerError):
    """The credentials were refused (401/403): the sink pauses; evaluation goes on, messages wait."""


class TrackerRejected(TrackerError):
    """This message can never be taken (malformed for the tracker): given up, so it stops blocking.
    Raised for a call that carried several messages, the relay sends them again one by one to find it."""


@dataclass(frozen=True)
class Batch:
    """What ``deliver_many`` did: the first ``len(fresh)`` messages are delivered (each True when logged
    now, False when the tracker had it already); ``error`` says why it stopped before the rest (None: all
    delivered)."""

    fresh: tuple[bool, ...]
    error: TrackerError | None = None


class Sink(Protocol):
    name: str

    def deliver_many(self, items: Sequence[tuple[str, Message]]) -> Batch:
        """Log ``items`` (each an event id and its message), in order, in as few tracker calls as the
        tracker's API allows."""
        ...

    def where(self, run: str) -> str:
        """Where ``run``'s results go, for a person (a URL, a folder)."""
        ...

    def close(self) -> None: ...
