"""The tracker relay: sends each tracker's outbox messages until the tracker has them.

One thread per tracker (the libraries block), sharing the webhook relay's outbox discipline: a message is
claimed under a lease (another daemon's relay skips it), handed to the sink, and marked delivered only when
the sink returned; a tracker that is down is tried again after an exponential backoff with jitter, for as
long as it takes; refused credentials pause the sink (one error line, evaluation goes on, nothing queued is
dropped) and it tries again after ``pause_secs``. A run's messages go in the order they were queued.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import structlog

from daemon.alerts.relay import backoff
from daemon.trackers.base import Sink, TrackerRefused, TrackerRejected
from daemon.trackers.config import TrackerConfig
from daemon.trackers.messages import ResultMessage
from storage import alerting
from storage.database import Database
from storage.errors import DatabaseUnreachable
from storage.models import utcnow

log = structlog.get_logger("daemon.trackers.relay")

POLL_SECS = 1.0
CLAIM_MARGIN_SECS = 5.0


def make_sink(config: TrackerConfig, environ: Mapping[str, str]) -> Sink:
    """The sink of ``config.kind``; its library is imported here, not before."""
    if config.kind == "mlflow":
        from daemon.trackers.mlflow import MlflowSink

        return MlflowSink(config, environ)
    if config.kind == "wandb":
        from daemon.trackers.wandb import WandbSink

        return WandbSink(config, environ)
    from daemon.trackers.tensorboard import TensorBoardSink

    return TensorBoardSink(config)


@dataclass(frozen=True)
class Sent:
    """What one ``send_one`` did."""

    delivered: bool
    #: False: the sink had it already (sent before a crash, or a backfill of what went live).
    fresh: bool = False
    paused: bool = False


class SinkWorker:
    """One tracker's sending: the part the daemon's thread and ``evald export`` share."""

    def __init__(
        self,
        database: Database,
        config: TrackerConfig,
        environ: Mapping[str, str],
        *,
        rng: random.Random | None = None,
        sink_factory: Callable[[TrackerConfig, Mapping[str, str]], Sink] = make_sink,
    ) -> None:
        self._db = database
        self.config = config
        self._environ = environ
        self._rng = rng or random.Random()
        self._factory = sink_factory
        self._sink: Sink | None = None
        self.paused_until: float | None = None

    @property
    def sink(self) -> Sink:
        if self._sink is None:
            self._sink = self._factory(self.config, self._environ)
        return self._sink

    def claim(self) -> alerting.Due | None:
        lease = timedelta(seconds=self.config.timeout_secs * 3 + CLAIM_MARGIN_SECS)
        with self._db.session() as session:
            claimed = alerting.due(session, endpoint=self.config.endpoint, now=utcnow(), lease=lease, limit=1)
        return claimed[0] if claimed else None

    def send_one(self, due: alerting.Due) -> Sent:
        endpoint = self.config.endpoint
        try:
            message = ResultMessage.from_json(due.body)
        except (ValueError, KeyError, TypeError) as exc:
            with self._db.session() as session:
                alerting.give_up(session, due.id, f"cannot be read: {exc}")
            log.error("tracker.unreadable", tracker=self.config.name, event_id=due.event_id, error=str(exc))
            return Sent(delivered=False)
        started_at = utcnow()
        started = time.perf_counter()
        error: str | None = None
        fresh = False
        refused = rejected = False
        try:
            fresh = self.sink.deliver(due.event_id, message)
        except TrackerRefused as exc:
            error, refused = str(exc), True
        except TrackerRejected as exc:
            error, rejected = str(exc), True
        except Exception as exc:
            # Down, slow, or a library's own error: the message waits in the outbox and is tried again.
            error = str(exc) or type(exc).__name__
        duration = time.perf_counter() - started
        with self._db.session() as session:
            attempts = alerting.record_attempt(
                session, due.id, alerting.Attempt(started_at, duration, None, error)
            )
            if error is None:
                alerting.delivered(session, due.id)
                if self.paused_until is not None:
                    log.info("tracker.resumed", tracker=self.config.name)
                self.paused_until = None
                log.info(
                    "tracker.delivered",
                    tracker=self.config.name,
                    event_id=due.event_id,
                    run=message.run,
                    step=message.step,
                    task=message.task,
                    attempts=attempts,
                    already_there=not fresh,
                )
                return Sent(delivered=True, fresh=fresh)
            if rejected:
                alerting.give_up(session, due.id, error)
                log.error("tracker.rejected", tracker=self.config.name, event_id=due.event_id, error=error)
                return Sent(delivered=False)
            if refused:
                alerting.retry_at(
                    session, due.id, utcnow() + timedelta(seconds=self.config.pause_secs), error
                )
                if self.paused_until is None:
                    # One line per pause, not per try: the operator fixes the credential and reloads.
                    log.error(
                        "tracker.paused",
                        tracker=self.config.name,
                        endpoint=endpoint,
                        error=error,
                        retry_in_s=self.config.pause_secs,
                        detail="credentials refused: results wait in the outbox, evaluation goes on",
                    )
                self.paused_until = time.monotonic() + self.config.pause_secs
                return Sent(delivered=False, paused=True)
            delay = backoff(attempts, self.config.max_backoff_secs, self._rng)
            alerting.retry_at(session, due.id, utcnow() + timedelta(seconds=delay), error)
        log.warning(
            "tracker.retry",
            tracker=self.config.name,
            event_id=due.event_id,
            attempts=attempts,
            error=error,
            retry_in_s=round(delay, 3),
        )
        return Sent(delivered=False)

    def wait_hint(self) -> float:
        """Seconds until the next message is due (at most the poll interval)."""
        with self._db.session() as session:
            later = alerting.next_due_at(session, endpoint=self.config.endpoint)
        if later is None:
            return POLL_SECS
        return min(POLL_SECS, max(0.0, (later - utcnow()).total_seconds()))

    def close(self) -> None:
        if self._sink is not None:
            try:
                self._sink.close()
            except Exception as exc:
                log.warning("tracker.close_failed", tracker=self.config.name, error=repr(exc))
            self._sink = None


class TrackerRelay:
    """The daemon's tracker threads: started and stopped with the webhook relay."""

    def __init__(
        self,
        database: Database,
        trackers: Sequence[TrackerConfig],
        environ: Mapping[str, str],
        *,
        sink_factory: Callable[[TrackerConfig, Mapping[str, str]], Sink] = make_sink,
    ) -> None:
        self.workers = [SinkWorker(database, t, environ, sink_factory=sink_factory) for t in trackers]
        self._events = {w.config.name: threading.Event() for w in self.workers}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    def start(self) -> TrackerRelay:
        for worker in self.workers:
            thread = threading.Thread(
                target=self._serve, args=(worker,), name=f"evald-tracker-{worker.config.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def wake(self) -> None:
        for event in self._events.values():
            event.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        self.wake()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    def _serve(self, worker: SinkWorker) -> None:
        event = self._events[worker.config.name]
        try:
            while not self._stopping.is_set():
                event.clear()
                wait = POLL_SECS
                try:
                    if worker.paused_until is not None and time.monotonic() < worker.paused_until:
                        wait = min(POLL_SECS, worker.paused_until - time.monotonic())
                        # A wake during a pause is not a reason to try the refused credential again.
                        self._stopping.wait(max(wait, 0.01))
                        continue
                    due = worker.claim()
                    if due is not None:
                        worker.send_one(due)
                        continue
                    wait = worker.wait_hint()
                except DatabaseUnreachable as exc:
                    log.warning("tracker.db_unavailable", tracker=worker.config.name, error=str(exc))
                except Exception as exc:
                    log.exception("tracker.relay_failed", tracker=worker.config.name, error=repr(exc))
                event.wait(max(wait, 0.01))
        finally:
            worker.close()
