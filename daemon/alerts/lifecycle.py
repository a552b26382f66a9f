"""The alert lifecycle: findings of a stored result become alerts, firing → resolved, and their notices.

Runs in the transaction that stores the result (in a savepoint), so the result, the alert and its outbox
rows commit together; the relay sends them afterwards. An alert is known by its fingerprint (run, rule,
metric, task): a repeat of a firing alert updates it (and is sent again only after the cooldown); a metric
rule that no longer fires at a new checkpoint resolves its alert, which is sent too.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import structlog
from sqlalchemy.orm import Session

from daemon.alerts.episodes import Episode, latest_episodes
from daemon.alerts.notices import SEVERITY_RANK, Told, news
from daemon.anomaly import Finding, Point
from daemon.anomaly.detector import judge
from daemon.anomaly.series import difference_noise
from daemon.config import Config
from daemon.delivery.alert_notice import notice_body
from daemon.delivery.payload import Event
from daemon.delivery.tracker_queue import TrackerQueue
from daemon.scheduling import stages
from inference.metrics import higher_is_better
from storage import alerting, outbox, queries
from storage.models import Alert, AlertState, utcnow

log = structlog.get_logger("daemon.alerts")

#: Rules of the metric detectors: an alert of one of these resolves when its rule no longer fires.
METRIC_RULES = frozenset(
    {
        "robust_z",
        "drop_from_best",
        "ewma",
        "cusum",
        "threshold",
        "non_finite",
        "length_explosion",
        "entropy_collapse",
        "reward_hacking",
        "zero_spread_rising",
    }
)


#: Alerts from the daemon's own events (not from a metric): each resolves when the run's task next stores
#: a good result (for a tp disagreement: one without).
OPERATIONAL_RULES = frozenset({"eval_failed", "deferred_stuck", "tp_disagreement"})


def fingerprint(run: str, rule: str, metric: str | None, task: str | None) -> str:
    return hashlib.sha256(json.dumps([run, rule, metric, task]).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Best:
    metric: str
    step: int
    value: float
    checkpoint: str


def best_point(
    points: Sequence[Point], names: Mapping[int, str], better: bool | None, metric: str
) -> Best | None:
    finite = [p for p in points if math.isfinite(p.value)]
    if better is None or not finite:
        return None
    top = max(finite, key=lambda p: p.value if better else -p.value)
    return Best(metric, top.step, top.value, names.get(top.step, ""))


def rollback_step(points: Sequence[Point], finding: Finding, better: bool | None) -> int | None:
    """The last step before ``finding`` whose value was within noise (2 standard errors) of the best
    before it: where to roll back to after a regression. None without a direction or history."""
    before = [p for p in points if p.step < finding.step and math.isfinite(p.value)]
    if better is None or not before:
        return None
    best = max(before, key=lambda p: p.value if better else -p.value)
    for point in reversed(before):
        gap = (best.value - point.value) if better else (point.value - best.value)
        if gap <= 2 * difference_noise(point, [best]):
            return point.step
    return best.step


class JobPlace(Protocol):
    """Where a job belongs (a claimed job, a stuck one): what an operational alert is about."""

    @property
    def run_id(self) -> int: ...
    @property
    def run(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def step(self) -> int | None: ...


@dataclass
class Notice:
    alert_id: int
    run: str
    body: dict[str, Any]
    severity: str


class Alerter:
    """Turns stored results into alerts and outbox rows; ``wake`` tells the relay there is mail."""

    def __init__(self, config: Config, wake: Callable[[], None] = lambda: None) -> None:
        self._config = config
        self._settings = config.alerts.settings()
        self._wake = wake
        self._feedback: dict[str, dict[str, Any]] = {}
        #: ``[[trackers]]``: each result's message queued beside its alerts, in the same transaction.
        self._trackers = TrackerQueue(config.trackers)

    def direction(self, metric: str) -> bool | None:
        override = self._config.alerts.directions.get(metric)
        if override is not None:
            return {"higher": True, "lower": False, "none": None}[override]
        return higher_is_better(metric)

    def watched_stage(self, task: str) -> str:
        return stages.QUICK if task in self._config.scheduling.two_stage else stages.FULL

    def after_result(self, session: Session, job: queries.ClaimedJob, *, tp_disagreed: bool = False) -> int:
        """Alerts for the result just stored for ``job``, in its transaction; returns the notices queued.
        A failure is logged and undone (a savepoint): the result itself still commits."""
        # What a transaction that never committed computed must not be written after the next one.
        self._feedback = {}
        self._trackers.after_result(session, job_id=job.id, run=job.run, run_id=job.run_id)
        try:
            with session.begin_nested():
                return self._after_result(session, job, tp_disagreed)
        except Exception as exc:
            log.exception("alerts.failed", job_id=job.id, run=job.run, error=repr(exc))
            return 0

    def operational(self, session: Session, job: JobPlace, *, rule: str, severity: str, message: str) -> int:
        """An alert from the daemon's own events (a job that failed for good, one deferred past its limit,
        a tp disagreement), in the transaction that records the event."""
        self._feedback = {}
        run, task, step = job.run, job.task, job.step
        try:
            with session.begin_nested():
                fp = fingerprint(run, rule, None, task)
                # No metric: the alert has no value, and a run-level event may have no step.
                finding = Finding(rule, "", step or 0, math.nan, None, severity, message)  # type: ignore[arg-type]
                notice = self._fire(session, job, fp, finding, utcnow())
                if notice is None:
                    return 0
                self._enqueue(session, notice)
                log.info("alerts.queued", run=run, rule=rule, task=task, step=step)
                return 1
        except Exception as exc:
            log.exception("alerts.failed", run=run, rule=rule, error=repr(exc))
            return 0

    def _after_result(self, session: Session, job: queries.ClaimedJob, tp_disagreed: bool) -> int:
        if job.step is None:
            return 0
        notices = [
            self._resolve(job, alert, utcnow())
            for alert in alerting.firing(session, run_id=job.run_id, task=job.task)
            if alert.rule in OPERATIONAL_RULES and not (alert.rule == "tp_disagreement" and tp_disagreed)
        ]
        for notice in notices:
            self._enqueue(session, notice)
        if job.stage != self.watched_stage(job.task):
            return len(notices)
        return len(notices) + self._metric_alerts(session, job)

    def _metric_alerts(self, session: Session, job: queries.ClaimedJob) -> int:
        """Re-judge the run's whole series in step order and bring each metric alert to its latest episode:
        a late older result re-judges the steps after it, as if evaluated oldest first."""
        assert job.step is not None
        rows = alerting.run_series(session, run_id=job.run_id, task=job.task, stage=job.stage)
        series = {
            metric: [Point(r.step, r.value, r.n, r.stderr) for r in points] for metric, points in rows.items()
        }
        names = {r.step: r.checkpoint for points in rows.values() for r in points}
        directions = {metric: self.direction(metric) for metric in series}
        bounds = {metric: (b.min, b.max) for metric, b in self._config.alerts.thresholds.items()}
        judged = judge(series, directions, self._settings, bounds)
        episodes = {
            fingerprint(job.run, rule, metric, job.task): episode
            for (rule, metric), episode in latest_episodes(judged).items()
        }
        now = utcnow()
        notices: list[Notice] = []
        for fp, episode in episodes.items():
            notice = self._follow(session, job, fp, episode, series, names, directions, now)
            if notice is not None:
                notices.append(notice)
        for alert in alerting.firing(session, run_id=job.run_id, task=job.task):
            if alert.rule in METRIC_RULES and alert.fingerprint not in episodes:
                notices.append(self._withdraw(job, alert, now))
        for alert in alerting.resolved(session, run_id=job.run_id, task=job.task):
            if (
                alert.rule in METRIC_RULES
                and alert.fingerprint not in episodes
                and alert.resolved_step is not None
            ):
                # Fired and resolved on a judgement the full series no longer makes (judged before older
                # results came): withdrawn in the record too, without a word (its receivers heard it end).
                self._mark_withdrawn(job, alert, now)
        for notice in notices:
            self._enqueue(session, notice)
        if job.step >= max(judged, default=job.step):
            best_metric = self._config.alerts.best_metric
            best = best_point(series.get(best_metric, []), names, self.direction(best_metric), best_metric)
            self._feedback[job.run] = self._status(session, job, best)
        if notices:
            log.info("alerts.queued", run=job.run, step=job.step, task=job.task, notices=len(notices))
        return len(notices)

    def _follow(
        self,
        session: Session,
        job: queries.ClaimedJob,
        fp: str,
        episode: Episode,
        series: Mapping[str, Sequence[Point]],
        names: Mapping[int, str],
        directions: Mapping[str, bool | None],
        now: datetime,
    ) -> Notice | None:
        """Bring the alert of ``fp`` to ``episode``, its latest; the notice to send, if any
        (:func:`daemon.alerts.notices.news`: a new episode, its end, one firing again, steps a late older
        result moved, a reminder after the cooldown or an escalation). What is not news (a firing episode
        reaching a newer step within the cooldown) is recorded without a word."""
        finding = episode.latest
        alert = alerting.by_fingerprint(session, fp)
        if alert is None:
            alert = Alert(
                fingerprint=fp, run_id=job.run_id, task=job.task, metric=finding.metric, rule=finding.rule
            )
            session.add(alert)
            before = None
        else:
            before = Told(
                alert.first_step,
                alert.last_step,
                alert.resolved_step,
                alert.state is AlertState.FIRING,
                alert.severity,
                alert.notified_at,
            )
        same = before is not None and episode.overlaps(before.first_step, before.last_step)
        cooldown = timedelta(seconds=self._config.alerts.cooldown_secs)
        event = news(before, episode, now=now, cooldown=cooldown)
        if not same or (episode.firing and before is not None and not before.firing):
            alert.fired_at = now
        alert.state = AlertState.FIRING if episode.firing else AlertState.RESOLVED
        was_resolved = before is not None and not before.firing
        alert.resolved_at = None if episode.firing else (alert.resolved_at if same and was_resolved else now)
        _describe(alert, episode, series, names, directions.get(finding.metric))
        alert.updated_at = now
        session.flush()
        if event is None:
            return None
        alert.notified_at = now
        ends_at = None if episode.firing else alert.resolved_at
        return Notice(
            alert.id, job.run, self._body(job.run, alert, ends_at=ends_at, event=event), alert.severity
        )

    def _withdraw(self, job: queries.ClaimedJob, alert: Alert, now: datetime) -> Notice:
        """A firing alert whose rule no longer fires at any step once the series is judged in step order (a
        late older result changed its baseline): resolved, saying why; its steps stay as they were."""
        alert.state = AlertState.RESOLVED
        alert.resolved_at = now
        self._mark_withdrawn(job, alert, now)
        return Notice(alert.id, job.run, self._body(job.run, alert, ends_at=now), alert.severity)

    @staticmethod
    def _mark_withdrawn(job: queries.ClaimedJob, alert: Alert, now: datetime) -> None:
        """A withdrawn alert: no step resolved it (the rule never fires once the series is judged in step
        order), and its message says so."""
        alert.updated_at = now
        alert.resolved_step = None
        alert.message = (
            f"withdrawn: with step {job.step}'s result the series judged in step order no longer shows "
            f"{alert.rule} on {alert.metric} at steps {alert.first_step}..{alert.last_step}"
        )

    def _fire(
        self, session: Session, place: JobPlace, fp: str, finding: Finding, now: datetime
    ) -> Notice | None:
        """Fire (or repeat) an operational alert; sent when it starts firing, again after the cooldown."""
        alert = alerting.by_fingerprint(session, fp)
        cooldown = timedelta(seconds=self._config.alerts.cooldown_secs)
        # A run-level event may have no step.
        step = finding.step or None
        if alert is None:
            alert = Alert(
                fingerprint=fp, run_id=place.run_id, task=place.task, metric=None, rule=finding.rule
            )
            session.add(alert)
            event: Event | None = "fired"
            alert.repeats, alert.fired_at = 1, now
            newest = _start_episode(alert, step)
        elif alert.state is AlertState.RESOLVED:
            event, alert.repeats, alert.fired_at, alert.resolved_at = "fired", 1, now, None
            newest = _start_episode(alert, step)
        else:
            alert.repeats += 1
            escalated = SEVERITY_RANK[finding.severity] > SEVERITY_RANK.get(alert.severity, 0)
            due = alert.notified_at is None or now - alert.notified_at >= cooldown
            event = "escalated" if escalated else "reminder" if due else None
            newest = _extend_episode(alert, step)
        alert.state = AlertState.FIRING
        if newest or SEVERITY_RANK[finding.severity] > SEVERITY_RANK.get(alert.severity, 0):
            alert.severity = finding.severity
        if newest:
            alert.checkpoint = None
            alert.value = alert.baseline = alert.best_step = alert.rollback_step = None
            alert.message = finding.message
        alert.updated_at = now
        session.flush()
        if event is None:
            return None
        alert.notified_at = now
        body = self._body(place.run, alert, ends_at=None, event=event)
        return Notice(alert.id, place.run, body, alert.severity)

    def _resolve(self, job: queries.ClaimedJob, alert: Alert, now: datetime) -> Notice:
        """An operational alert cleared by the task's next good result."""
        alert.state = AlertState.RESOLVED
        alert.resolved_at = now
        alert.updated_at = now
        alert.message = f"{alert.rule} cleared: task {job.task} stored a result at step {job.step}"
        # The episode's first and last steps stay: where it started and how long it lasted.
        alert.resolved_step = job.step
        return Notice(alert.id, job.run, self._body(job.run, alert, ends_at=now), alert.severity)

    def _body(
        self, run: str, alert: Alert, ends_at: datetime | None, event: Event | None = None
    ) -> dict[str, Any]:
        return notice_body(run, alert, ends_at=ends_at, links=self._config.alerts.links, event=event)

    def _enqueue(self, session: Session, notice: Notice) -> None:
        if self._trackers:
            # ``[[trackers]]`` get the notice too (W&B alerts, MLflow tags): their own rows and relay.
            self._trackers.after_alert(
                session, alert_id=notice.alert_id, run_id=self._run_id(session, notice), body=notice.body
            )
        endpoints = [
            w.name
            for w in self._config.webhooks
            if SEVERITY_RANK[notice.severity] >= SEVERITY_RANK[w.min_severity]
            # An endpoint that answered 410 Gone gets nothing more (the alert itself is still stored).
            and outbox.disabled(session, w.name) is None
        ]
        if not endpoints:
            return
        alert = session.get(Alert, notice.alert_id)
        assert alert is not None
        # Stored, not sent: Python's NaN token round-trips a NaN value to the relay, which renders it.
        body = json.dumps(notice.body, default=str, allow_nan=True)
        outbox.enqueue(
            session,
            alert=alert,
            endpoints=endpoints,
            event_ids=[f"evald_{uuid.uuid4().hex}" for _ in endpoints],
            body=body,
        )

    @staticmethod
    def _run_id(session: Session, notice: Notice) -> int:
        alert = session.get(Alert, notice.alert_id)
        assert alert is not None, f"alert {notice.alert_id} of a notice is not in its own transaction"
        return alert.run_id

    def _status(self, session: Session, job: queries.ClaimedJob, best: Best | None) -> dict[str, Any]:
        firing = [a for a in alerting.alert_rows(session, run=job.run, state="firing")]
        rollbacks = [a.rollback_step for a in firing if a.rollback_step is not None]
        return {
            "run": job.run,
            "updated_at": utcnow().isoformat(),
            "step": job.step,
            "best": None
            if best is None
            else {
                "metric": best.metric,
                "step": best.step,
                "value": best.value,
                "checkpoint": best.checkpoint,
            },
            "rollback_step": min(rollbacks) if rollbacks else None,
            "firing": [
                {
                    "rule": a.rule,
                    "metric": a.metric,
                    "task": a.task,
                    "step": a.first_step,
                    "first_step": a.first_step,
                    "last_step": a.last_step,
                    "severity": a.severity,
                    "message": a.message,
                    "rollback_step": a.rollback_step,
                }
                for a in firing
            ],
        }

    def after_commit(self) -> None:
        """Once the result's transaction committed: status files written, the relay woken."""
        feedback, self._feedback = self._feedback, {}
        directory = self._config.alerts.feedback_dir
        if directory is not None:
            for run, status in feedback.items():
                try:
                    write_status(directory, run, status)
                except OSError as exc:
                    # A full disk must not stop evaluations: the alerts are stored and sent regardless.
                    log.error("alerts.status_unwritten", run=run, directory=str(directory), error=str(exc))
        self._wake()


def _start_episode(alert: Alert, step: int | None) -> bool:
    """A new firing episode begins at ``step``: its onset and its latest step so far."""
    alert.first_step = alert.last_step = step
    alert.resolved_step = None
    return True


def _extend_episode(alert: Alert, step: int | None) -> bool:
    """A repeat at ``step`` of a firing alert widens its episode; True when ``step`` is its newest."""
    if step is None:
        return True
    alert.first_step = step if alert.first_step is None else min(alert.first_step, step)
    newest = alert.last_step is None or step >= alert.last_step
    if newest:
        alert.last_step = step
    return newest


def write_status(directory: Path, run: str, status: Mapping[str, Any]) -> Path:
    """``DIRECTORY/RUN.json``, replaced atomically: a trainer polling it never reads half a file."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{run}.json"
    tmp = directory / f".{run}.json.tmp"
    tmp.write_text(json.dumps(status, indent=1, default=str), encoding="utf-8")
    tmp.replace(path)
    return path


def _describe(
    alert: Alert,
    episode: Episode,
    series: Mapping[str, Sequence[Point]],
    names: Mapping[int, str],
    direction: bool | None,
) -> None:
    """Set what ``alert`` says of ``episode``: its steps, severity, value against the baseline, the best
    step before it and the step to roll back to, and its message (firing, or recovered)."""
    finding = episode.latest
    alert.first_step, alert.last_step = episode.first_step, episode.last_step
    alert.resolved_step = episode.resolved_step
    alert.repeats = episode.repeats
    alert.severity = finding.severity
    alert.checkpoint = names.get(episode.last_step)
    alert.value = finding.value
    alert.baseline = finding.baseline
    upto = [p for p in series.get(finding.metric, []) if p.step <= episode.last_step]
    best = best_point(upto, names, direction, finding.metric)
    alert.best_step = best.step if best else None
    alert.rollback_step = rollback_step(upto, finding, direction)
    alert.message = (
        finding.message
        if episode.firing
        else f"{finding.metric} recovered at step {episode.resolved_step} ({finding.rule} no longer fires)"
    )
