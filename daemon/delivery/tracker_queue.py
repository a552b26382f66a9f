"""Tracker messages queued in the result's transaction: a result is never stored without its messages,
nor a message queued for a result that did not commit; an alert's event likewise, in the transaction that
stores the alert's change, beside its webhook rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.orm import Session

from daemon.config import TrackerConfig
from daemon.delivery.alert_notice import notice_body
from daemon.delivery.messages import AlertEvent, alert_event_id, event_id, result_message, succeeded_jobs
from storage import outbox
from storage.models import Alert, AlertState, Run

log = structlog.get_logger("daemon.delivery.tracker_queue")


class TrackerQueue:
    def __init__(self, trackers: Sequence[TrackerConfig]) -> None:
        self._trackers = tuple(trackers)

    def __bool__(self) -> bool:
        return bool(self._trackers)

    def queue(self, session: Session, *, job_id: int, run: str, run_id: int) -> int:
        """One outbox row per tracker that takes ``run`` for job ``job_id``'s stored results; returns how
        many were queued (an id queued before, by a backfill say, is not queued again)."""
        queued = 0
        for tracker in self._trackers:
            if not tracker.takes(run):
                continue
            message = result_message(session, job_id, samples=tracker.samples)
            if message is None:
                continue
            if outbox.enqueue_message(
                session,
                run_id=run_id,
                endpoint=tracker.endpoint,
                event_id=event_id(tracker.endpoint, job_id, tracker.target),
                body=message.to_json(),
                target=tracker.target,
                legacy_id=event_id(tracker.endpoint, job_id),
            ):
                queued += 1
        return queued

    def history(self, session: Session, *, run: str, run_id: int) -> tuple[int, int, int]:
        """Every stored evaluation of ``run`` and each of its alerts' latest event, queued for each tracker
        that takes it where not queued for its target yet (a backfill; a tracker pointed somewhere new).
        Returns (evaluations, alert events, queued)."""
        jobs = succeeded_jobs(session, run)
        events = self.stored_alert_events(session, run_id=run_id)
        queued = 0
        for tracker in self._trackers:
            if not tracker.takes(run):
                continue
            ids = {job: event_id(tracker.endpoint, job, tracker.target) for job in jobs}
            legacy = {job: event_id(tracker.endpoint, job) for job in jobs}
            known = outbox.known_ids(session, [*ids.values(), *legacy.values()], target=tracker.target)
            missing = [job for job in jobs if ids[job] not in known and legacy[job] not in known]
            queued += TrackerQueue([tracker]).queue_many(session, missing, run=run, run_id=run_id)
            queued += sum(self._queue_alert(session, tracker, event, run_id) for event in events)
        return len(jobs), len(events), queued

    def queue_many(self, session: Session, jobs: Sequence[int], *, run: str, run_id: int) -> int:
        return sum(self.queue(session, job_id=job, run=run, run_id=run_id) for job in jobs)

    def after_result(self, session: Session, *, job_id: int, run: str, run_id: int) -> int:
        """``queue`` in a savepoint: a failure is logged and undone, and the result still commits (the
        backfill, ``evald export``, sends it later)."""
        if not self._trackers:
            return 0
        try:
            with session.begin_nested():
                return self.queue(session, job_id=job_id, run=run, run_id=run_id)
        except Exception as exc:
            log.exception("tracker.queue_failed", job_id=job_id, run=run, error=repr(exc))
            return 0

    def after_alert(self, session: Session, *, alert_id: int, run_id: int, body: Mapping[str, Any]) -> int:
        """One outbox row per tracker that takes the alert's run, for one notice of it (``body``: what
        the webhooks get); in a savepoint, so a failure here leaves the alert and its webhooks as they
        are. Returns how many were queued."""
        run = str(body.get("run", ""))
        takers = [t for t in self._trackers if t.takes(run)]
        if not takers:
            return 0
        try:
            with session.begin_nested():
                root = session.get(Run, run_id)
                event = AlertEvent.from_notice(
                    dict(body), alert_id=alert_id, run_root=root.root if root is not None else ""
                )
                return sum(self._queue_alert(session, tracker, event, run_id) for tracker in takers)
        except Exception as exc:
            log.exception("tracker.alert_queue_failed", alert_id=alert_id, run=run, error=repr(exc))
            return 0

    def queue_alerts(self, session: Session, events: Sequence[AlertEvent], *, run: str, run_id: int) -> int:
        """``events`` (``stored_alert_events``) queued for a backfill; returns how many. An event sent live
        has the same id and is not queued again."""
        return sum(
            self._queue_alert(session, tracker, event, run_id)
            for event in events
            for tracker in self._trackers
            if tracker.takes(run)
        )

    @staticmethod
    def stored_alert_events(session: Session, *, run_id: int) -> list[AlertEvent]:
        """The run's alerts, each as its latest event: firing, or resolved (with its whole episode: the
        firing before it is not sent after it, which would show a resolved alert as firing)."""
        root = session.get(Run, run_id)
        if root is None:
            return []
        alerts = session.scalars(
            select(Alert).where(Alert.run_id == run_id).order_by(Alert.fired_at, Alert.id)
        ).all()
        events = []
        for alert in alerts:
            resolved = alert.state is AlertState.RESOLVED
            body = notice_body(root.name, alert, ends_at=alert.resolved_at if resolved else None, links={})
            event = AlertEvent.from_notice(body, alert_id=alert.id, run_root=root.root)
            events.append(replace(event, backfilled=True))
        return events

    @staticmethod
    def _queue_alert(session: Session, tracker: TrackerConfig, event: AlertEvent, run_id: int) -> int:
        return int(
            outbox.enqueue_message(
                session,
                run_id=run_id,
                endpoint=tracker.endpoint,
                event_id=alert_event_id(tracker.endpoint, event, tracker.target),
                body=event.to_json(),
                target=tracker.target,
                legacy_id=alert_event_id(tracker.endpoint, event),
            )
        )
