"""``evald export mlflow|wandb|tensorboard --run R``: what is already stored, sent to a tracker.

Each of the run's evaluations, and each of its alerts as its latest event (firing, or resolved with its
episode), is queued in the outbox under the id it would have had live (so one sent live, or by an earlier
backfill, is not queued again), then the tracker's messages are sent here, by the same code as the
daemon's relay; the sink's own record of delivered ids covers a message sent before a crash. Running it
twice logs nothing twice. A running daemon's relay may send some of them meanwhile: the outbox's claims
keep the two from sending one message both. A backfilled alert is recorded, not notified (no W&B alert).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from daemon.config import Config, TrackerConfig
from daemon.delivery.messages import alert_event_id, event_id, succeeded_jobs
from daemon.delivery.relay import Lane
from daemon.delivery.tracker_queue import TrackerQueue
from daemon.delivery.trackers import TrackerRoute
from daemon.errors import EvaldError
from storage import outbox
from storage.database import Database
from storage.models import OutboxMessage, OutboxState, Run


@dataclass(frozen=True)
class Backfilled:
    tracker: str
    evaluations: int
    alerts: int
    queued: int
    sent: int
    #: Delivered before (live or by an earlier backfill), or found in the tracker already.
    already: int
    #: Left in the outbox (the tracker down, or refusing): the daemon's relay, or the next backfill,
    #: sends them.
    pending: int
    where: str


def pick_tracker(config: Config, kind: str, name: str | None) -> TrackerConfig:
    found = [t for t in config.trackers if t.kind == kind and (name is None or t.name == name)]
    if not found:
        named = f" named {name!r}" if name else ""
        raise EvaldError(
            f"no [[trackers]] table with kind = {kind!r}{named} in the config: add one "
            f"(kind, tracking_uri/project, ...) and run this again"
        )
    if len(found) > 1:
        raise EvaldError(
            f"{len(found)} trackers of kind {kind!r} ({', '.join(t.name for t in found)}): "
            "pass --tracker NAME"
        )
    return found[0]


def backfill(
    database: Database, tracker: TrackerConfig, *, run: str, environ: Mapping[str, str]
) -> Backfilled:
    if not tracker.takes(run):
        raise EvaldError(
            f"tracker {tracker.name!r} does not take run {run!r} (its runs: {', '.join(tracker.runs)})"
        )
    with database.session() as session:
        run_id = session.scalar(select(Run.id).where(Run.name == run))
        if run_id is None:
            known = ", ".join(sorted(session.scalars(select(Run.name)))) or "none"
            raise EvaldError(f"no run named {run!r} in the database (runs: {known})")
        # Rows queued before targets were kept are this target's (as the daemon's relay takes them).
        outbox.adopt(session, endpoint=tracker.endpoint, target=tracker.target)
        jobs = succeeded_jobs(session, run)
        events = TrackerQueue.stored_alert_events(session, run_id=run_id)
        ids = [
            *(event_id(tracker.endpoint, job, target) for job in jobs for target in (tracker.target, None)),
            *(
                alert_event_id(tracker.endpoint, e, target)
                for e in events
                for target in (tracker.target, None)
            ),
        ]
        # Delivered live, by an earlier backfill, or (each alert's latest event) what it would send.
        before = _delivered(session, ids, tracker.target)
        _, _, queued = TrackerQueue([tracker]).history(session, run=run, run_id=run_id)
    # Only this run's: the other runs' history for a new target is the daemon's relay's to queue.
    lane = Lane(database, TrackerRoute(tracker, environ), prepare=False)
    sent = already = 0
    try:
        while dues := lane.claim():
            outcome = lane.send(dues)
            sent += outcome.fresh
            already += outcome.delivered - outcome.fresh
            if outcome.stopped:
                # Down or refusing: what is left waits in the outbox, retried with its backoff.
                break
        where = lane.sink.where(run)
    finally:
        lane.close()
    with database.session() as session:
        pending = int(
            session.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(
                    OutboxMessage.endpoint == tracker.endpoint,
                    OutboxMessage.target == tracker.target,
                    OutboxMessage.state == OutboxState.PENDING,
                )
            )
            or 0
        )
    return Backfilled(tracker.name, len(jobs), len(events), queued, sent, before + already, pending, where)


def _delivered(session: Session, ids: list[str], target: str) -> int:
    if not ids:
        return 0
    return int(
        session.scalar(
            select(func.count())
            .select_from(OutboxMessage)
            .where(
                OutboxMessage.event_id.in_(ids),
                OutboxMessage.target == target,
                OutboxMessage.state == OutboxState.DELIVERED,
            )
        )
        or 0
    )
