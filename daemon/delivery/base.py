"""The sink contract: a :class:`Sink` delivers a batch of messages, a :class:`Route` is its place in the
outbox, a :class:`Voice` its family's log lines.

The relay (:mod:`daemon.delivery.relay`) claims a route's due messages from the outbox under a lease (one,
or up to ``batch`` in one transaction), reads each stored body with ``Route.read``, hands them to the sink
in one ``deliver_many``, and marks delivered, in one transaction, those the sink says it delivered; a sink
stops at the first message it could not deliver and says why with one of the errors of
:mod:`daemon.delivery.errors` (down: backoff; refused credentials: pause; a message it can never take:
given up; gone: disabled). Since a crash can fall between a sink's write and the outbox's mark, a sink that
can also remembers what it delivered (in the tracker itself where it can), so a message sent again is
logged once. Sinks: :mod:`.sinks.webhook`, :mod:`.sinks.mlflow`, :mod:`.sinks.wandb`,
:mod:`.sinks.tensorboard`, and the in-memory twin :mod:`.memory` the contract test holds them all to.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Generic, TypeVar

from daemon.delivery.errors import SinkError, SinkRejected

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from daemon.outage import Outage
    from storage.outbox import Due

#: What one sink takes: a rendered webhook body, a tracker message.
M = TypeVar("M")


@dataclass(frozen=True)
class Batch:
    """What ``deliver_many`` did: the first ``len(fresh)`` messages are delivered (each True when logged
    now, False when the tracker had it already); ``error`` says why it stopped before the rest (None: all
    delivered). ``status``: the receiver's answer to a delivered one, kept in the attempts' history."""

    fresh: tuple[bool, ...]
    error: SinkError | None = None
    status: int | None = None


class Sink(ABC, Generic[M]):
    """A connection to one destination; made in its lane's thread, used and closed there."""

    name: str

    @abstractmethod
    def deliver_many(self, items: Sequence[tuple[str, M]]) -> Batch:
        """Log ``items`` (each an event id and its message), in order, in as few calls as the destination's
        API allows."""

    @abstractmethod
    def where(self, run: str) -> str:
        """Where ``run``'s messages go, for a person (a URL, a folder)."""

    def close(self) -> None:
        """Let go of connections and files; the sink is not used after."""


class Voice(ABC, Generic[M]):
    """A sink family's log lines (``webhook.*``, ``tracker.*``): what the relay did, in the words and
    fields that family's operators and tests read."""

    @abstractmethod
    def unreadable(self, route: Route[M], due: Due, error: Exception, why: str) -> None: ...

    @abstractmethod
    def delivered(
        self, route: Route[M], done: Sequence[tuple[Due, M]], *, fresh: int, attempts: int, seconds: float
    ) -> None: ...

    def resumed(self, route: Route[M]) -> None:
        """Delivered again after a pause."""

    @abstractmethod
    def retry(
        self, route: Route[M], left: Sequence[Due], error: SinkError, *, attempts: int, delay: float
    ) -> None: ...

    @abstractmethod
    def gave_up(self, route: Route[M], due: Due, error: SinkRejected, *, attempts: int) -> None: ...

    def paused(self, route: Route[M], error: SinkError, *, delay: float, waiting: int) -> None:
        """The credentials were refused: one line per pause, not per try."""

    def disabled(self, route: Route[M], error: SinkError, *, dropped: int) -> None:
        """The endpoint is gone, and ``dropped`` pending messages with it."""

    def still_disabled(self, route: Route[M], reason: str) -> None:
        """At the start: the endpoint was disabled before."""

    @abstractmethod
    def db_unavailable(self, route: Route[M], error: Exception, outage: Outage | None) -> None: ...

    @abstractmethod
    def failed(self, route: Route[M], error: Exception) -> None:
        """A pass of the lane failed unexpectedly (logged with its traceback); it tries again."""

    def close_failed(self, route: Route[M], error: Exception) -> None:
        """Closing the sink failed: it is dropped all the same."""


class Route(ABC, Generic[M]):
    """One sink's place in the outbox: its rows (``endpoint``), how many go in a claim, how long a claim
    holds, how it backs off; ``open`` makes the sink, in its lane's thread (a tracker's library loads
    there, not when the daemon starts)."""

    #: True: one message of a run in flight at a time (a webhook receiver sees a run's alerts in order
    #: because the next is claimed only once the one before is settled); False: several of a run at once,
    #: still each run's in the order queued.
    one_per_run: bool = False
    #: The outbox row's last error when its stored body cannot be read: ``<unreadable>: <why>``.
    unreadable: str = "cannot be read"
    #: Only the endpoint's rows of this target are sent (a tracker's: where it points now); None: all.
    target: str | None = None

    def __init__(
        self,
        *,
        name: str,
        endpoint: str,
        voice: Voice[M],
        max_backoff_secs: float,
        batch: int = 1,
        pause_secs: float = 0.0,
    ) -> None:
        #: Its name in the config and the logs.
        self.name = name
        #: Its rows in the outbox (``OutboxMessage.endpoint``).
        self.endpoint = endpoint
        self.voice = voice
        #: Backoff's cap, and how long refused credentials pause the route.
        self.max_backoff_secs = max_backoff_secs
        self.pause_secs = pause_secs
        #: Messages claimed at most at once, and handed to one ``deliver_many``.
        self.batch = batch

    @property
    @abstractmethod
    def lease(self) -> timedelta:
        """How long a claim holds: long enough for the calls a claimed batch takes."""

    @abstractmethod
    def read(self, event_id: str, body: str) -> M:
        """The stored body as the sink takes it; ValueError, KeyError or TypeError: it never will (the
        message is given up)."""

    def prepare(self, session: Session) -> None:
        """Before the lane's first claim, in its transaction (a tracker queues its runs' history for a
        target it did not point at before)."""

    def arrange(self, items: list[tuple[Due, M]]) -> list[tuple[Due, M]]:
        """The order ``deliver_many`` gets ``items`` in (as claimed, unless a route groups them)."""
        return items

    @abstractmethod
    def open(self) -> Sink[M]: ...
