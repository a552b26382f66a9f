"""What a tracker is sent: one evaluation's results (and a bounded sample table), as stored, or one alert
event (fired, notified again, resolved).

A result message is built in the transaction that stores the result (or, for a backfill, from what is
stored) and queued in the outbox under a stable id: ``tracker:<name>``, its target (where it points: the
server and experiment, project, folder) and the job id give the same id every time, so a backfill of what
was already sent live queues nothing, and a sink that records delivered ids logs
nothing twice. An alert event is built in the transaction that stores the alert's change (or, for a
backfill, from the stored alert), under an id made of the alert, its state, its episode's start and end and
its severity: the notice that fired an episode and a backfill of that firing alert have one id, so neither
is logged twice. A reminder after the cooldown (same episode, state and severity) is the same event to a
tracker, which shows state rather than pages: it goes to the webhooks only.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import Checkpoint, EvalJob, JobState, Result, Run, Sample

#: The stage whose values carry the plain key; a quick-subset value is ``eval/<task>/quick/<metric>``.
FULL_STAGE = "full"


@dataclass(frozen=True)
class MetricValue:
    name: str
    value: float
    stderr: float | None
    n: int | None


@dataclass(frozen=True)
class SampleEntry:
    prompt: str
    response: str
    reference: str
    #: None: not graded (an lm-eval perplexity sample).
    correct: bool | None


@dataclass(frozen=True)
class ResultMessage:
    run: str
    run_root: str
    job_id: int
    task: str
    stage: str
    step: int
    checkpoint: str
    checkpoint_path: str
    metrics: tuple[MetricValue, ...]
    samples: tuple[SampleEntry, ...] = field(default=())
    kind: str = "result"
    #: When the evaluation finished (ms since the epoch): every value's timestamp, the same at each
    #: redelivery, so MLflow's store takes a value sent twice as one (its key includes the timestamp).
    #: None in messages queued before it was kept: the sending time.
    finished_ms: int | None = None

    def key(self, metric: str, part: str | None = None) -> str:
        """``eval/<task>/<metric>`` (``/stderr``, ``/n`` beside it); the quick stage under its own name."""
        base = f"eval/{self.task}" if self.stage == FULL_STAGE else f"eval/{self.task}/{self.stage}"
        return f"{base}/{metric}" if part is None else f"{base}/{metric}/{part}"

    def scalars(self, *, stderr: bool = True, n: bool = True) -> list[tuple[str, float]]:
        """The values this message logs, by key: each metric, its stderr and n where known (and asked
        for)."""
        out: list[tuple[str, float]] = []
        for m in self.metrics:
            out.append((self.key(m.name), m.value))
            if stderr and m.stderr is not None and math.isfinite(m.stderr):
                out.append((self.key(m.name, "stderr"), m.stderr))
            if n and m.n is not None:
                out.append((self.key(m.name, "n"), float(m.n)))
        return out

    def to_json(self) -> str:
        # NaN stays NaN (a diverged metric is a fact to show, not to drop): Python's token round-trips.
        return json.dumps(asdict(self), allow_nan=True)

    @classmethod
    def from_json(cls, body: str) -> ResultMessage:
        data: dict[str, Any] = json.loads(body)
        data["metrics"] = tuple(MetricValue(**m) for m in data["metrics"])
        data["samples"] = tuple(SampleEntry(**s) for s in data.get("samples", ()))
        return cls(**data)


@dataclass(frozen=True)
class AlertEvent:
    """One notice of an alert (as the webhooks get it): fired, notified again after its cooldown, resolved."""

    run: str
    run_root: str
    alert_id: int
    rule: str
    severity: str
    #: ``firing`` or ``resolved``.
    state: str
    #: The onset while it fires, the step that resolved it after; None: a run-level event.
    step: int | None
    task: str | None
    metric: str | None
    value: float | None
    baseline: float | None
    message: str
    #: ISO time it fired (``starts_at``) and, resolved, when (``ends_at``).
    starts_at: str
    ends_at: str | None = None
    checkpoint: str | None = None
    rollback_step: int | None = None
    kind: str = "alert"
    #: Sent by ``evald export`` from what was stored, not as it happened: a tracker records it (tags,
    #: summary) but does not notify anyone (no W&B alert for an old event).
    backfilled: bool = False

    @property
    def title(self) -> str:
        """One line naming the alert (W&B's alert title; also its tag's summary)."""
        what = "/".join(p for p in (self.task, self.metric) if p) or self.rule
        at = f" at step {self.step}" if self.step is not None else ""
        return f"evald {self.run}: {self.rule} on {what}{at} ({self.state})"

    def facts(self, event_id: str) -> dict[str, Any]:
        """What a tracker keeps of the event (MLflow's tag, W&B's summary)."""
        return {
            "event_id": event_id,
            "state": self.state,
            "rule": self.rule,
            "severity": self.severity,
            "task": self.task,
            "metric": self.metric,
            "step": self.step,
            # JSON has no NaN: a non-finite value (a diverged metric) is null, the message says what it was.
            "value": _finite(self.value),
            "baseline": _finite(self.baseline),
            "rollback_step": self.rollback_step,
            "checkpoint": self.checkpoint,
            "message": self.message,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
        }

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=True)

    @classmethod
    def from_notice(cls, body: dict[str, Any], *, alert_id: int, run_root: str) -> AlertEvent:
        """From the alert's notice body (``Alerter._body``: what the webhooks are sent)."""
        value = body.get("value")
        return cls(
            run=str(body["run"]),
            run_root=run_root,
            alert_id=alert_id,
            rule=str(body["rule"]),
            severity=str(body["severity"]),
            state=str(body["state"]),
            step=body.get("step"),
            task=body.get("task"),
            metric=body.get("metric"),
            value=None if value is None else float(value),
            baseline=body.get("baseline"),
            message=str(body.get("message") or ""),
            starts_at=str(body.get("starts_at") or ""),
            ends_at=body.get("ends_at"),
            checkpoint=body.get("checkpoint"),
            rollback_step=body.get("rollback_step"),
        )


Message = ResultMessage | AlertEvent


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def parse(body: str) -> Message:
    """An outbox body back as its message (by its ``kind``); ValueError/KeyError/TypeError when unreadable."""
    data: dict[str, Any] = json.loads(body)
    if data.get("kind", "result") == "alert":
        return AlertEvent(**data)
    return ResultMessage.from_json(body)


#: An alert event's id starts so (an evaluation's with ``trk_``): counted apart where results went.
ALERT_PREFIX = "trka_"


def alert_event_id(endpoint: str, event: AlertEvent, target: str | None = None) -> str:
    """The id of ``event`` to ``endpoint``'s ``target``: the same for the live notice and a backfill of it
    (see the module's docstring); the times in ms, so an ISO string with or without its zone gives one
    id. ``target`` None: the id it had before targets were kept (a row queued then)."""
    starts = _iso_ms(event.starts_at)
    ends = _iso_ms(event.ends_at) if event.ends_at else ""
    where = endpoint if target is None else f"{endpoint}|{target}"
    key = f"{where}|alert|{event.alert_id}|{event.state}|{starts}|{ends}|{event.severity}"
    return f"{ALERT_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:40]}"


def _iso_ms(text: str) -> int | str:
    try:
        return epoch_ms(datetime.fromisoformat(text))
    except ValueError:
        return text


def epoch_ms(when: datetime) -> int:
    """``when`` in ms since the epoch (a naive time is UTC, as SQLite hands them back)."""
    aware = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return int(aware.timestamp() * 1000)


def event_id(endpoint: str, job_id: int, target: str | None = None) -> str:
    """The outbox id of job ``job_id``'s message to ``endpoint``'s ``target``: the same live and in a
    backfill; another target, another id. ``target`` None: the id it had before targets were kept."""
    where = endpoint if target is None else f"{endpoint}|{target}"
    digest = hashlib.sha256(f"{where}|result|{job_id}".encode()).hexdigest()[:40]
    return f"trk_{digest}"


def result_message(session: Session, job_id: int, *, samples: int) -> ResultMessage | None:
    """Job ``job_id``'s message as stored; None for a job with no step (nothing to plot it at) or not
    succeeded."""
    row = session.execute(
        select(EvalJob, Checkpoint, Run)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .where(EvalJob.id == job_id)
    ).one_or_none()
    if row is None:
        return None
    job, checkpoint, run = row
    if checkpoint.step is None or job.state != JobState.SUCCEEDED:
        return None
    results = session.scalars(select(Result).where(Result.job_id == job_id).order_by(Result.metric))
    metrics = tuple(
        MetricValue(r.metric, math.nan if r.value is None else float(r.value), r.stderr, r.n)
        for r in results
        # n = 0 is a metric over no samples: no value to plot.
        if r.n != 0
    )
    table: tuple[SampleEntry, ...] = ()
    if samples:
        rows = session.scalars(
            select(Sample)
            .where(Sample.job_id == job_id, Sample.error.is_(None))
            .order_by(Sample.index)
            .limit(samples)
        )
        table = tuple(SampleEntry(s.prompt, s.response, s.reference, s.correct) for s in rows)
    return ResultMessage(
        run=run.name,
        run_root=run.root,
        job_id=job.id,
        task=job.task,
        stage=job.stage,
        step=checkpoint.step,
        checkpoint=checkpoint.name,
        checkpoint_path=checkpoint.path,
        metrics=metrics,
        samples=table,
        finished_ms=None if job.finished_at is None else epoch_ms(job.finished_at),
    )


def succeeded_jobs(session: Session, run: str) -> list[int]:
    """The run's succeeded jobs with a step, oldest first: what a backfill sends."""
    return list(
        session.scalars(
            select(EvalJob.id)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .join(Run, Checkpoint.run_id == Run.id)
            .where(Run.name == run, EvalJob.state == JobState.SUCCEEDED, Checkpoint.step.is_not(None))
            .order_by(EvalJob.finished_at, EvalJob.id)
        )
    )
