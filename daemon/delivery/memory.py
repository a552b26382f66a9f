"""The in-memory sink: the contract's twin, delivering into a list, told how to fail.

What every sink does, without a server: it delivers a batch in order, knows the ids it has (a message sent
again is delivered, not logged twice), and stops at the first message it cannot take with the error that
says what comes next (down, refused, rejected, gone). The relay's own tests run on it, and the contract
test holds the real sinks to what it does.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import structlog

from daemon.delivery.base import Batch, Route, Sink, Voice
from daemon.delivery.errors import SinkError, SinkRejected

if TYPE_CHECKING:
    from daemon.outage import Outage
    from storage.outbox import Due

log = structlog.get_logger("daemon.delivery.memory")


@dataclass
class Memory:
    """What reached the sink, and how it answers next; shared by the route's sinks (one per opening)."""

    #: Event id and body of each message logged, in the order logged; each id once.
    logged: list[tuple[str, str]] = field(default_factory=list)
    #: Raised at the next message, before it is logged (None: take it).
    failing: SinkError | None = None
    #: Ids it never takes (each raises ``reject``'s error).
    rejects: dict[str, SinkError] = field(default_factory=dict)
    #: ``deliver_many`` calls, each with how many messages it carried.
    calls: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def ids(self) -> list[str]:
        with self.lock:
            return [event_id for event_id, _ in self.logged]


class MemorySink(Sink[str]):
    def __init__(self, name: str, memory: Memory) -> None:
        self.name = name
        self._memory = memory
        self.closed = False

    def deliver_many(self, items: Sequence[tuple[str, str]]) -> Batch:
        memory = self._memory
        fresh: list[bool] = []
        with memory.lock:
            memory.calls.append(len(items))
            for event_id, body in items:
                error = memory.failing or memory.rejects.get(event_id)
                if error is not None:
                    return Batch(tuple(fresh), error)
                known = any(event_id == logged for logged, _ in memory.logged)
                if not known:
                    memory.logged.append((event_id, body))
                fresh.append(not known)
        return Batch(tuple(fresh))

    def where(self, run: str) -> str:
        return f"memory {self.name}"

    def close(self) -> None:
        self.closed = True


class MemoryVoice(Voice[str]):
    """``memory.*`` lines, with the ids a test looks for."""

    def unreadable(self, route: Route[str], due: Due, error: Exception, why: str) -> None:
        log.error("memory.unreadable", sink=route.name, event_id=due.event_id, error=why)

    def delivered(
        self, route: Route[str], done: Sequence[tuple[Due, str]], *, fresh: int, attempts: int, seconds: float
    ) -> None:
        log.info("memory.delivered", sink=route.name, event_ids=[d.event_id for d, _ in done], fresh=fresh)

    def resumed(self, route: Route[str]) -> None:
        log.info("memory.resumed", sink=route.name)

    def retry(
        self, route: Route[str], left: Sequence[Due], error: SinkError, *, attempts: int, delay: float
    ) -> None:
        log.warning("memory.retry", sink=route.name, event_ids=[d.event_id for d in left], error=str(error))

    def gave_up(self, route: Route[str], due: Due, error: SinkRejected, *, attempts: int) -> None:
        log.error(
            "memory.gave_up", sink=route.name, event_id=due.event_id, error=str(error), attempts=attempts
        )

    def paused(self, route: Route[str], error: SinkError, *, delay: float, waiting: int) -> None:
        log.error("memory.paused", sink=route.name, error=str(error), waiting=waiting)

    def disabled(self, route: Route[str], error: SinkError, *, dropped: int) -> None:
        log.error("memory.disabled", sink=route.name, error=str(error), dropped=dropped)

    def db_unavailable(self, route: Route[str], error: Exception, outage: Outage | None) -> None:
        log.warning("memory.db_unavailable", sink=route.name, error=str(error))

    def failed(self, route: Route[str], error: Exception) -> None:
        log.exception("memory.failed", sink=route.name, error=repr(error))


class MemoryRoute(Route[str]):
    """A route to a :class:`MemorySink`: the stored body is the message, as stored."""

    def __init__(
        self,
        name: str,
        memory: Memory,
        *,
        batch: int = 1,
        one_per_run: bool = False,
        max_backoff_secs: float = 1.0,
        pause_secs: float = 1.0,
        lease_secs: float = 30.0,
    ) -> None:
        super().__init__(
            name=name,
            endpoint=f"memory:{name}",
            voice=MemoryVoice(),
            max_backoff_secs=max_backoff_secs,
            batch=batch,
            pause_secs=pause_secs,
        )
        self.memory = memory
        self.one_per_run = one_per_run
        self._lease = timedelta(seconds=lease_secs)

    @property
    def lease(self) -> timedelta:
        return self._lease

    def read(self, event_id: str, body: str) -> str:
        if not body:
            raise ValueError("an empty body")
        return body

    def open(self) -> MemorySink:
        return MemorySink(self.name, self.memory)
