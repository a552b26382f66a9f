"""The tracker relay: sends each tracker's outbox messages until the tracker has them.

One thread per tracker (the libraries block), sharing the webhook relay's outbox discipline: messages are
claimed under a lease (another daemon's relay skips them), up to ``batch`` of them in one transaction,
handed to the sink in one ``deliver_many`` (one MLflow ``log_batch`` per hundred evaluations, one W&B
``log`` per step), and those it took marked delivered in one transaction; a tracker that is down is tried
again after an exponential backoff with jitter, for as long as it takes; refused credentials pause the sink
(one error line, evaluation goes on, nothing queued is dropped) and it tries again after ``pause_secs``. A
run's messages go in the order they were queued. ``batch = 1`` sends one message per claim, as before.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import structlog

from daemon.alerts.relay import backoff
from daemon.trackers.base import (
    Batch,
    Sink,
    TrackerError,
    TrackerRefused,
    TrackerRejected,
    TrackerUnavailable,
)
from daemon.trackers.config import TrackerConfig
from daemon.trackers.messages import AlertEvent, Message, parse
from storage import alerting
from storage.database import Database
from storage.errors import DatabaseUnreachable
from storage.models import utcnow

log = structlog.get_logger("daemon.trackers.relay")

POLL_SECS = 1.0
CLAIM_MARGIN_SECS = 5.0
#: Messages one tracker call carries at most (MLflow's ``log_batch``: 100 tags, one per evaluation): the
#: claim's lease allows a timeout for each such call.
CALL_MESSAGES = 100


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
    """What one ``send`` did."""

    #: Delivered now, or found in the tracker already.
    delivered: int = 0
    #: Of those, logged now (the rest the sink had already: sent before a crash, or a backfill).
    fresh: int = 0
    #: Some were left for later (the tracker down or refusing): a backfill stops there.
    stopped: bool = False
    paused: bool = False

    def __add__(self, other: Sent) -> Sent:
        return Sent(
            self.delivered + other.delivered,
            self.fresh + other.fresh,
            self.stopped or other.stopped,
            self.paused or other.paused,
        )


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

    def claim(self) -> list[alerting.Due]:
        """Up to ``batch`` due messages, claimed in one transaction, long enough for the calls they take."""
        calls = math.ceil(self.config.batch / CALL_MESSAGES)
        lease = timedelta(seconds=self.config.timeout_secs * (2 + calls) + CLAIM_MARGIN_SECS)
        with self._db.session() as session:
            return alerting.due_many(
                session, endpoint=self.config.endpoint, now=utcnow(), lease=lease, limit=self.config.batch
            )

    def send(self, dues: Sequence[alerting.Due]) -> Sent:
        """Hand ``dues`` to the sink in one ``deliver_many``; mark what it took in one transaction, and
        what it did not for a retry after a backoff (or a pause)."""
        items: list[tuple[alerting.Due, Message]] = []
        unreadable: list[tuple[alerting.Due, str]] = []
        for due in dues:
            try:
                items.append((due, parse(due.body)))
            except (ValueError, KeyError, TypeError) as exc:
                unreadable.append((due, f"cannot be read: {exc}"))
        if unreadable:
            with self._db.session() as session:
                for due, why in unreadable:
                    alerting.give_up(session, due.id, why)
                    log.error(
                        "tracker.unreadable", tracker=self.config.name, event_id=due.event_id, error=why
                    )
        if not items:
            return Sent()
        # Each run's messages together (a stable sort: in the order queued within a run), so a backlog
        # of runs evaluated side by side still goes in a few calls per run, not one per message.
        items.sort(key=lambda item: item[1].run)
        started_at = utcnow()
        started = time.perf_counter()
        try:
            batch = self.sink.deliver_many([(due.event_id, message) for due, message in items])
        except TrackerError as exc:
            batch = Batch((), exc)
        except Exception as exc:
            # A library's own error (or the sink failing to start): the messages wait and are tried again.
            batch = Batch((), TrackerUnavailable(str(exc) or type(exc).__name__))
        duration = time.perf_counter() - started
        done, left = items[: len(batch.fresh)], items[len(batch.fresh) :]
        fresh = sum(batch.fresh)
        error = batch.error if left else None
        if left and error is None:
            error = TrackerUnavailable("the sink stopped without saying why")
        why = str(error) if error is not None else ""
        with self._db.session() as session:
            if done:
                alerting.record_attempts(
                    session, [due.id for due, _ in done], alerting.Attempt(started_at, duration, None, None)
                )
                alerting.delivered_many(session, [due.id for due, _ in done])
            attempts, delay = 0, 0.0
            if left and not isinstance(error, TrackerRejected):
                ids = [due.id for due, _ in left]
                attempts = alerting.record_attempts(
                    session, ids, alerting.Attempt(started_at, duration, None, why)
                )
                if isinstance(error, TrackerRefused):
                    delay = self.config.pause_secs
                else:
                    delay = backoff(attempts, self.config.max_backoff_secs, self._rng)
                alerting.retry_many_at(session, ids, utcnow() + timedelta(seconds=delay), why)
        if done:
            if self.paused_until is not None:
                log.info("tracker.resumed", tracker=self.config.name)
            self.paused_until = None
            steps = [m.step for _, m in done if m.step is not None]
            log.info(
                "tracker.delivered",
                tracker=self.config.name,
                messages=len(done),
                runs=sorted({m.run for _, m in done}),
                steps=f"{min(steps)}..{max(steps)}" if steps else None,
                alerts=sum(isinstance(m, AlertEvent) for _, m in done),
                already_there=len(done) - fresh,
                seconds=round(duration, 3),
            )
        sent = Sent(delivered=len(done), fresh=fresh)
        if not left:
            return sent
        if isinstance(error, TrackerRejected):
            if len(left) > 1:
                # One call carried several: sent one by one, the malformed one is found and given up.
                for due, _ in left:
                    sent = sent + self.send([due])
                return sent
            ((due, _),) = left
            with self._db.session() as session:
                alerting.record_attempt(session, due.id, alerting.Attempt(started_at, duration, None, why))
                alerting.give_up(session, due.id, why)
            log.error("tracker.rejected", tracker=self.config.name, event_id=due.event_id, error=why)
            return sent
        if isinstance(error, TrackerRefused):
            if self.paused_until is None:
                # One line per pause, not per try: the operator fixes the credential and reloads.
                log.error(
                    "tracker.paused",
                    tracker=self.config.name,
                    endpoint=self.config.endpoint,
                    error=why,
                    retry_in_s=self.config.pause_secs,
                    waiting=len(left),
                    detail="credentials refused: results wait in the outbox, evaluation goes on",
                )
            self.paused_until = time.monotonic() + self.config.pause_secs
            return sent + Sent(stopped=True, paused=True)
        log.warning(
            "tracker.retry",
            tracker=self.config.name,
            messages=len(left),
            first_event_id=left[0][0].event_id,
            attempts=attempts,
            error=why,
            retry_in_s=round(delay, 3),
        )
        return sent + Sent(stopped=True)

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
                    dues = worker.claim()
                    if dues:
                        worker.send(dues)
                        continue
                    wait = worker.wait_hint()
                except DatabaseUnreachable as exc:
                    log.warning("tracker.db_unavailable", tracker=worker.config.name, error=str(exc))
                except Exception as exc:
                    log.exception("tracker.relay_failed", tracker=worker.config.name, error=repr(exc))
                event.wait(max(wait, 0.01))
        finally:
            worker.close()
