"""The relay: sends each route's outbox messages until its sink has them, the one machine of every sink.

One thread per route (a webhook endpoint, a tracker), so a sink that hangs or is down delays only its own
messages. Messages are claimed under a lease (another daemon's relay skips them): a webhook's one at a time,
a tracker's up to ``batch`` in one transaction; they go to the sink in one ``deliver_many`` (one MLflow
``log_batch`` per hundred evaluations, one W&B ``log`` per step) and those it took are marked delivered in
one transaction. A sink that is down is tried again after an exponential backoff with jitter (a
``Retry-After`` honoured), for as long as it takes: nothing is dropped because its receiver was down.
Refused credentials pause the route (one error line, evaluation goes on, nothing queued is dropped) and
it tries again after ``pause_secs``, or at once when a reload changes it or the daemon starts again (a
fixed credential); a message the sink can never take is given up (after ``after`` tries)
so it stops blocking its run; a gone endpoint (410) is disabled with its pending messages. A run's messages
go in the order they were queued. Every attempt is kept (``alert_deliveries``).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from daemon.config import Config
from daemon.delivery.backoff import delay as next_delay
from daemon.delivery.base import Batch, Route, Sink
from daemon.delivery.errors import SinkError, SinkGone, SinkRefused, SinkRejected, SinkUnavailable
from daemon.outage import Outage
from storage import outbox
from storage.database import Database
from storage.errors import DatabaseUnreachable
from storage.models import utcnow

#: Seconds between looks at the outbox when nothing wakes the relay (another daemon may have queued).
POLL_SECS = 1.0


@dataclass(frozen=True)
class Sent:
    """What one ``send`` did."""

    #: Delivered now, or found in the tracker already.
    delivered: int = 0
    #: Of those, logged now (the rest the sink had already: sent before a crash, or a backfill).
    fresh: int = 0
    #: Some were left for later (the sink down or refusing): a backfill stops there.
    stopped: bool = False
    paused: bool = False

    def __add__(self, other: Sent) -> Sent:
        return Sent(
            self.delivered + other.delivered,
            self.fresh + other.fresh,
            self.stopped or other.stopped,
            self.paused or other.paused,
        )


@dataclass(frozen=True)
class _Outcome:
    """What one ``deliver_many`` did: the messages the sink took (``done``, ``fresh`` of them new to it)
    and those it left (``left``) with its ``error``."""

    done: list[tuple[outbox.Due, Any]]
    left: list[tuple[outbox.Due, Any]]
    fresh: int
    status: int | None
    error: SinkError | None
    started_at: datetime
    duration: float

    @property
    def split(self) -> bool:
        """One call carried several and one of them can never be taken: sent one by one, it is found."""
        return isinstance(self.error, SinkRejected) and len(self.left) > 1


@dataclass
class _Recorded:
    """What the transaction after a ``deliver_many`` recorded: attempts counted, the backoff or pause
    chosen (seconds), the messages dropped with a gone endpoint, the rejection given up on."""

    took: int = 0
    attempts: int = 0
    wait: float = 0.0
    dropped: int = 0
    given_up: SinkRejected | None = None


class Lane:
    """One route's sending: the part the daemon's thread and ``evald export`` share."""

    def __init__(
        self, database: Database, route: Route[Any], *, rng: random.Random | None = None, prepare: bool = True
    ) -> None:
        self._db = database
        self.route = route
        self._rng = rng or random.Random()
        self._sink: Sink[Any] | None = None
        self.paused_until: float | None = None
        #: ``route.prepare`` is run before the first claim (not for a backfill of one run).
        self._prepared = not prepare

    @property
    def sink(self) -> Sink[Any]:
        if self._sink is None:
            self._sink = self.route.open()
        return self._sink

    def warm(self) -> None:
        """Open the sink now; one that fails to open is opened again at the first send, which says why."""
        with contextlib.suppress(Exception):
            _ = self.sink

    def claim(self) -> list[outbox.Due]:
        """Up to ``batch`` due messages, claimed in one transaction, for as long as sending them may take:
        a relay killed mid-send leaves them to the next start after at most the lease."""
        route = self.route
        if not self._prepared:
            with self._db.session() as session:
                route.prepare(session)
            self._prepared = True
        with self._db.session() as session:
            claim = outbox.due if route.one_per_run else outbox.due_many
            return claim(
                session,
                endpoint=route.endpoint,
                now=utcnow(),
                lease=route.lease,
                limit=route.batch,
                target=route.target,
            )

    def send(self, dues: Sequence[outbox.Due]) -> Sent:
        """Hand ``dues`` to the sink in one ``deliver_many``; mark what it took in one transaction, and
        what it did not for a retry after a backoff (or a pause), give it up, or disable the endpoint."""
        items = self._readable(dues)
        if not items:
            return Sent()
        outcome = self._deliver(self.route.arrange(items))
        return self._settle(outcome, self._record(outcome))

    def _readable(self, dues: Sequence[outbox.Due]) -> list[tuple[outbox.Due, Any]]:
        """Each due message read into what its sink takes; one that cannot be read is given up, said once."""
        route = self.route
        items: list[tuple[outbox.Due, Any]] = []
        unreadable: list[tuple[outbox.Due, Exception]] = []
        for due in dues:
            try:
                items.append((due, route.read(due.event_id, due.body)))
            except (ValueError, KeyError, TypeError) as exc:
                unreadable.append((due, exc))
        if unreadable:
            with self._db.session() as session:
                for due, cause in unreadable:
                    why = f"{route.unreadable}: {cause}"
                    outbox.give_up(session, due.id, why)
                    route.voice.unreadable(route, due, cause, why)
        return items

    def _deliver(self, items: list[tuple[outbox.Due, Any]]) -> _Outcome:
        """One ``deliver_many`` call: which messages the sink took, which it left, and why."""
        started_at = utcnow()
        started = time.perf_counter()
        try:
            batch = self.sink.deliver_many([(due.event_id, message) for due, message in items])
        except SinkError as exc:
            batch = Batch((), exc)
        except Exception as exc:
            # A library's own error (or the sink failing to start): the messages wait and are tried again.
            batch = Batch((), SinkUnavailable(str(exc) or type(exc).__name__))
        duration = time.perf_counter() - started
        done, left = items[: len(batch.fresh)], items[len(batch.fresh) :]
        error = batch.error if left else None
        if left and error is None:
            error = SinkUnavailable("the sink stopped without saying why")
        return _Outcome(done, left, sum(batch.fresh), batch.status, error, started_at, duration)

    def _record(self, outcome: _Outcome) -> _Recorded:
        """In one transaction: the attempt of what the sink took (delivered), and of what it left: retried
        after a backoff or a pause, given up, or its endpoint disabled."""
        route, error = self.route, outcome.error
        recorded = _Recorded()
        with self._db.session() as session:
            if outcome.done:
                recorded.took = outbox.record_attempts(
                    session,
                    [due.id for due, _ in outcome.done],
                    outbox.Attempt(outcome.started_at, outcome.duration, outcome.status, None),
                )
                outbox.delivered_many(session, [due.id for due, _ in outcome.done])
            if error is None or outcome.split:
                return recorded
            why = str(error)
            ids = [due.id for due, _ in outcome.left]
            tried = outbox.Attempt(
                outcome.started_at,
                outcome.duration,
                error.status,
                None if error.status is not None else why,
                error.retry_after,
            )
            recorded.attempts = attempts = outbox.record_attempts(session, ids, tried)
            if isinstance(error, SinkGone):
                recorded.dropped = outbox.disable_endpoint(session, route.endpoint, why)
            elif isinstance(error, SinkRejected) and attempts >= error.after:
                recorded.given_up = error
                outbox.give_up(session, ids[0], f"{why} {attempts} times" if error.after > 1 else why)
            else:
                if isinstance(error, SinkRefused):
                    # Marked paused: `evald status` says so, and a reload that changes the route ends it.
                    recorded.wait, why = route.pause_secs, outbox.paused_error(why)
                else:
                    recorded.wait = next_delay(attempts, route.max_backoff_secs, self._rng, error.retry_after)
                outbox.retry_many_at(session, ids, utcnow() + timedelta(seconds=recorded.wait), why)
        return recorded

    def _settle(self, outcome: _Outcome, recorded: _Recorded) -> Sent:
        """What the lane says of a send and does next: resumed, each of a rejected batch sent alone, the
        route stopped, paused or waiting for its retry."""
        route, error, left = self.route, outcome.error, outcome.left
        if outcome.done:
            if self.paused_until is not None:
                route.voice.resumed(route)
            self.paused_until = None
            route.voice.delivered(
                route, outcome.done, fresh=outcome.fresh, attempts=recorded.took, seconds=outcome.duration
            )
        sent = Sent(delivered=len(outcome.done), fresh=outcome.fresh)
        if error is None:
            return sent
        if outcome.split:
            for due, _ in left:
                sent = sent + self.send([due])
            return sent
        if isinstance(error, SinkGone):
            route.voice.disabled(route, error, dropped=recorded.dropped)
            return sent + Sent(stopped=True)
        if recorded.given_up is not None:
            route.voice.gave_up(route, left[0][0], recorded.given_up, attempts=recorded.attempts)
            return sent
        if isinstance(error, SinkRefused):
            if self.paused_until is None:
                route.voice.paused(route, error, delay=recorded.wait, waiting=len(left))
            self.paused_until = time.monotonic() + route.pause_secs
            return sent + Sent(stopped=True, paused=True)
        route.voice.retry(
            route, [due for due, _ in left], error, attempts=recorded.attempts, delay=recorded.wait
        )
        return sent + Sent(stopped=True)

    def wait_hint(self) -> float:
        """Seconds until the next message is due (at most the poll interval)."""
        with self._db.session() as session:
            later = outbox.next_due_at(session, endpoint=self.route.endpoint, target=self.route.target)
        if later is None:
            return POLL_SECS
        return min(POLL_SECS, max(0.0, (later - utcnow()).total_seconds()))

    def close(self) -> None:
        if self._sink is not None:
            try:
                self._sink.close()
            except Exception as exc:
                self.route.voice.close_failed(self.route, exc)
            self._sink = None


class Relay:
    """The daemon's delivery threads, one per route: started, woken (a result's messages were just
    committed) and stopped together."""

    def __init__(
        self,
        database: Database,
        routes: Sequence[Route[Any]],
        *,
        rng: random.Random | None = None,
        outage: Outage | None = None,
        warm: bool = True,
    ) -> None:
        self._db = database
        #: Open each sink as its thread starts (a tracker's library loads then, seconds before the first
        #: result), not at the first message, which waited for MLflow's import (4 s); False: at the first.
        self._warm = warm
        rng = rng or random.Random()
        self.lanes = [Lane(database, route, rng=rng) for route in routes]
        #: Shared with the main loop: an outage is logged once, not once per pass of each thread.
        self._outage = outage
        self._events = {id(lane): threading.Event() for lane in self.lanes}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    def start(self) -> Relay:
        # Only a reminder: with the database away it is skipped, and the relay starts all the same.
        with contextlib.suppress(DatabaseUnreachable), self._db.session() as session:
            for lane in self.lanes:
                # 410 Gone stands across restarts: `evald webhook test NAME` answered 2xx enables it again.
                reason = outbox.disabled(session, lane.route.endpoint)
                if reason is not None:
                    lane.route.voice.still_disabled(lane.route, reason)
        for lane in self.lanes:
            thread = threading.Thread(
                target=self._serve, args=(lane,), name=f"evald-relay-{lane.route.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def wake(self) -> None:
        """Look at the outbox now (a result's messages were just committed)."""
        for event in self._events.values():
            event.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.wake()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def _serve(self, lane: Lane) -> None:
        event = self._events[id(lane)]
        route = lane.route
        try:
            if self._warm:
                lane.warm()
            while not self._stopping.is_set():
                event.clear()
                wait = POLL_SECS
                try:
                    if lane.paused_until is not None and time.monotonic() < lane.paused_until:
                        wait = min(POLL_SECS, lane.paused_until - time.monotonic())
                        # A wake during a pause is not a reason to try the refused credential again.
                        self._stopping.wait(max(wait, 0.01))
                        continue
                    dues = lane.claim()
                    if dues:
                        lane.send(dues)
                        continue
                    wait = lane.wait_hint()
                except DatabaseUnreachable as exc:
                    # The outbox waits for the database; the daemon's main loop says when it is over.
                    route.voice.db_unavailable(route, exc, self._outage)
                except Exception as exc:
                    # The database away for a moment must not end the relay: the outbox waits for it.
                    route.voice.failed(route, exc)
                event.wait(max(wait, 0.01))
        finally:
            lane.close()


def routes(config: Config, environ: Mapping[str, str], *, before: Config | None = None) -> list[Route[Any]]:
    """Every configured sink's route: the webhooks' with their secrets loaded (a missing secret stops the
    start: SecretError), then the trackers' (their libraries load in their threads). ``before``: the
    config a reload replaces (None: the daemon starts), which says which trackers changed."""
    from daemon.delivery.sinks.webhook import endpoints
    from daemon.delivery.trackers import tracker_routes

    trackers = tracker_routes(config.trackers, environ, before=None if before is None else before.trackers)
    return [*endpoints(config, environ), *trackers]
