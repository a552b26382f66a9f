"""A ``[[trackers]]`` table's route: its outbox rows, batches and pause, its sink (MLflow, W&B, TensorBoard,
made in its lane's thread, where the library loads), and the ``tracker.*`` log lines."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import select

from daemon.config import TrackerConfig
from daemon.delivery.base import Route, Sink, Voice
from daemon.delivery.errors import SinkError, SinkRejected
from daemon.delivery.messages import AlertEvent, Message, parse
from daemon.delivery.tracker_queue import TrackerQueue
from storage import outbox
from storage.models import Run, utcnow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from daemon.outage import Outage
    from storage.outbox import Due

log = structlog.get_logger("daemon.delivery.trackers")

#: A claimed message is another relay's to send again this long after its calls' own timeouts.
CLAIM_MARGIN_SECS = 5.0
#: Messages one tracker call carries at most (MLflow's ``log_batch``: 100 tags, one per evaluation): the
#: claim's lease allows a timeout for each such call.
CALL_MESSAGES = 100


def make_sink(config: TrackerConfig, environ: Mapping[str, str]) -> Sink[Message]:
    """The sink of ``config.kind``; its library is imported here, not before."""
    if config.kind == "mlflow":
        from daemon.delivery.sinks.mlflow import MlflowSink

        return MlflowSink(config, environ)
    if config.kind == "wandb":
        from daemon.delivery.sinks.wandb import WandbSink

        return WandbSink(config, environ)
    from daemon.delivery.sinks.tensorboard import TensorBoardSink

    return TensorBoardSink(config)


class TrackerVoice(Voice[Message]):
    def unreadable(self, route: Route[Message], due: Due, error: Exception, why: str) -> None:
        log.error("tracker.unreadable", tracker=route.name, event_id=due.event_id, error=why)

    def resumed(self, route: Route[Message]) -> None:
        log.info("tracker.resumed", tracker=route.name)

    def delivered(
        self,
        route: Route[Message],
        done: Sequence[tuple[Due, Message]],
        *,
        fresh: int,
        attempts: int,
        seconds: float,
    ) -> None:
        steps = [m.step for _, m in done if m.step is not None]
        log.info(
            "tracker.delivered",
            tracker=route.name,
            messages=len(done),
            runs=sorted({m.run for _, m in done}),
            steps=f"{min(steps)}..{max(steps)}" if steps else None,
            alerts=sum(isinstance(m, AlertEvent) for _, m in done),
            already_there=len(done) - fresh,
            seconds=round(seconds, 3),
        )

    def retry(
        self, route: Route[Message], left: Sequence[Due], error: SinkError, *, attempts: int, delay: float
    ) -> None:
        log.warning(
            "tracker.retry",
            tracker=route.name,
            messages=len(left),
            first_event_id=left[0].event_id,
            attempts=attempts,
            error=str(error),
            retry_in_s=round(delay, 3),
        )

    def gave_up(self, route: Route[Message], due: Due, error: SinkRejected, *, attempts: int) -> None:
        log.error("tracker.rejected", tracker=route.name, event_id=due.event_id, error=str(error))

    def paused(self, route: Route[Message], error: SinkError, *, delay: float, waiting: int) -> None:
        # One line per pause, not per try: the operator fixes the credential and reloads.
        log.error(
            "tracker.paused",
            tracker=route.name,
            endpoint=route.endpoint,
            error=str(error),
            retry_in_s=delay,
            waiting=waiting,
            detail="credentials refused: results wait in the outbox, evaluation goes on",
        )

    def db_unavailable(self, route: Route[Message], error: Exception, outage: Outage | None) -> None:
        log.warning("tracker.db_unavailable", tracker=route.name, error=str(error))

    def failed(self, route: Route[Message], error: Exception) -> None:
        log.exception("tracker.relay_failed", tracker=route.name, error=repr(error))

    def close_failed(self, route: Route[Message], error: Exception) -> None:
        log.warning("tracker.close_failed", tracker=route.name, error=repr(error))


VOICE = TrackerVoice()


class TrackerRoute(Route[Message]):
    """The route of one ``[[trackers]]`` table: up to ``batch`` messages a claim, each run's together."""

    def __init__(
        self,
        config: TrackerConfig,
        environ: Mapping[str, str],
        *,
        sink_factory: Callable[[TrackerConfig, Mapping[str, str]], Sink[Message]] = make_sink,
        resume: str | None = None,
    ) -> None:
        super().__init__(
            name=config.name,
            endpoint=config.endpoint,
            voice=VOICE,
            max_backoff_secs=config.max_backoff_secs,
            batch=config.batch,
            pause_secs=config.pause_secs,
        )
        self.config = config
        self.target = config.target
        self._environ = environ
        self._factory = sink_factory
        #: Why its messages waiting out a pause or a back-off are tried at once (the tracker changed at a
        #: reload, or the daemon started: a credential may be fixed); None: they keep their wait.
        self.resume = resume

    @property
    def lease(self) -> timedelta:
        calls = math.ceil(self.config.batch / CALL_MESSAGES)
        return timedelta(seconds=self.config.timeout_secs * (2 + calls) + CLAIM_MARGIN_SECS)

    def prepare(self, session: Session) -> None:
        """Rows queued before targets were kept become this target's; pointed somewhere it had not
        delivered to (another experiment, project, folder) while it has delivered elsewhere, it queues its
        runs' whole history there (what is queued for this target already is not queued again)."""
        endpoint, target = self.config.endpoint, self.target
        assert target is not None
        outbox.adopt(session, endpoint=endpoint, target=target)
        if self.resume is not None:
            self._retry_now(session, self.resume)
        before = outbox.other_targets(session, endpoint=endpoint, target=target)
        if not before:
            return
        queue = TrackerQueue([self.config])
        evaluations = alerts = queued = 0
        for run_id, run in session.execute(select(Run.id, Run.name).order_by(Run.id)).all():
            if self.config.takes(run):
                jobs, events, new = queue.history(session, run=run, run_id=run_id)
                evaluations, alerts, queued = evaluations + jobs, alerts + events, queued + new
        if queued:
            log.info(
                "tracker.target_changed",
                tracker=self.name,
                target=self.config.where,
                evaluations=evaluations,
                alerts=alerts,
                queued=queued,
                detail="the runs' history is sent to the new target; what it has already is not sent again",
            )

    def _retry_now(self, session: Session, why: str) -> None:
        """Its messages that wait out a pause (refused credentials) or a back-off, due now."""
        resumed = outbox.retry_now(session, endpoint=self.endpoint, target=self.target, now=utcnow())
        if resumed:
            log.info("tracker.retry_now", tracker=self.name, messages=resumed, reason=why)

    def read(self, event_id: str, body: str) -> Message:
        return parse(body)

    def arrange(self, items: list[tuple[Due, Message]]) -> list[tuple[Due, Message]]:
        # Each run's messages together (a stable sort: in the order queued within a run), so a backlog
        # of runs evaluated side by side still goes in a few calls per run, not one per message.
        return sorted(items, key=lambda item: item[1].run)

    def open(self) -> Sink[Message]:
        return self._factory(self.config, self._environ)


#: Why a tracker's waiting messages are tried at once (``tracker.retry_now``'s ``reason``).
STARTED = "the daemon started: its environment may hold a fixed credential"
CHANGED = "the tracker's settings changed at a reload"


def tracker_routes(
    trackers: Sequence[TrackerConfig],
    environ: Mapping[str, str],
    *,
    before: Sequence[TrackerConfig] | None = None,
) -> list[TrackerRoute]:
    """The routes of ``trackers``. ``before``: the trackers of the config a reload replaces (None: the
    daemon starts). What could fix a refusal (the credentials' variables, the URL, any setting of the
    table, or the environment at a start) ends the tracker's pause and back-off: it tries at once."""
    if before is None:
        return [TrackerRoute(tracker, environ, resume=STARTED) for tracker in trackers]
    return [
        TrackerRoute(tracker, environ, resume=None if tracker in before else CHANGED) for tracker in trackers
    ]
