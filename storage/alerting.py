"""Alert queries: the alert lifecycle's rows (what the detectors read, the alerts firing, as listed).

An alert's outbox rows (:mod:`storage.outbox`) are written in the transaction that writes the alert (and
the result that caused it), so an alert is never stored without being queued, nor queued without being
stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from storage.models import (
    Alert,
    AlertState,
    Checkpoint,
    EvalJob,
    JobState,
    OutboxMessage,
    OutboxState,
    Result,
    Run,
)


@dataclass(frozen=True)
class SeriesRow:
    step: int
    value: float
    n: int | None
    stderr: float | None
    checkpoint: str


def run_series(session: Session, *, run_id: int, task: str, stage: str) -> dict[str, list[SeriesRow]]:
    """Every metric of one run, task and stage, by step: what the detectors read."""
    rows = session.execute(
        select(Result.metric, Checkpoint.step, Result.value, Result.n, Result.stderr, Checkpoint.name)
        .join(EvalJob, Result.job_id == EvalJob.id)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .where(
            Checkpoint.run_id == run_id,
            EvalJob.task == task,
            EvalJob.stage == stage,
            EvalJob.state == JobState.SUCCEEDED,
            Checkpoint.step.is_not(None),
        )
        .order_by(Checkpoint.step, EvalJob.id)
    )
    series: dict[str, list[SeriesRow]] = {}
    for metric, step, value, n, stderr, name in rows:
        # n = 0 is a metric over no samples: no value, whatever number was stored (none is since 0008).
        if step is not None and n != 0:
            series.setdefault(metric, []).append(SeriesRow(step, value, n, stderr, name))
    return series


def firing(session: Session, *, run_id: int, task: str | None) -> list[Alert]:
    """The run's firing alerts for ``task`` (locked: two daemons storing results must not both fire)."""
    return _in_state(session, run_id, task, AlertState.FIRING)


def resolved(session: Session, *, run_id: int, task: str | None) -> list[Alert]:
    """The run's resolved alerts for ``task`` (locked, as :func:`firing`)."""
    return _in_state(session, run_id, task, AlertState.RESOLVED)


def _in_state(session: Session, run_id: int, task: str | None, state: AlertState) -> list[Alert]:
    return list(
        session.scalars(
            select(Alert)
            .where(Alert.run_id == run_id, Alert.task == task, Alert.state == state)
            .order_by(Alert.id)
            .with_for_update()
        )
    )


def by_fingerprint(session: Session, fingerprint: str) -> Alert | None:
    return session.scalar(select(Alert).where(Alert.fingerprint == fingerprint).with_for_update())


@dataclass(frozen=True)
class AlertRow:
    id: int
    run: str
    task: str | None
    metric: str | None
    rule: str
    severity: str
    state: str
    #: The onset: the earliest step it fired at in its latest episode (None: a run-level event, or an
    #: alert resolved before evald kept onsets).
    first_step: int | None
    #: The latest step it fired at in that episode.
    last_step: int | None
    #: The step whose result resolved it (None while firing).
    resolved_step: int | None
    #: Of the latest finding (``last_step``), as the message.
    value: float | None
    baseline: float | None
    best_step: int | None
    rollback_step: int | None
    message: str
    fired_at: datetime
    resolved_at: datetime | None
    repeats: int
    #: Outbox messages of this alert: delivered and all.
    delivered: int
    queued: int

    @property
    def step(self) -> int | None:
        """The step shown by default: the onset, where a person rolls back from."""
        return self.first_step

    def seen_at(self, step: int) -> bool:
        """Whether the alert's episode covers ``step``: from its onset to the last step it fired at."""
        if self.first_step is None:
            return False
        return self.first_step <= step <= (self.last_step if self.last_step is not None else self.first_step)


def alert_rows(session: Session, *, run: str | None = None, state: str | None = None) -> list[AlertRow]:
    delivered_count = (
        select(func.count())
        .where(OutboxMessage.alert_id == Alert.id, OutboxMessage.state == OutboxState.DELIVERED)
        .scalar_subquery()
    )
    queued_count = select(func.count()).where(OutboxMessage.alert_id == Alert.id).scalar_subquery()
    query = (
        select(Alert, Run.name, delivered_count, queued_count)
        .join(Run, Alert.run_id == Run.id)
        .order_by(Alert.fired_at, Alert.id)
    )
    if run is not None:
        query = query.where(Run.name == run)
    if state is not None:
        query = query.where(Alert.state == AlertState(state))
    return [
        AlertRow(
            id=a.id,
            run=name,
            task=a.task,
            metric=a.metric,
            rule=a.rule,
            severity=a.severity,
            state=a.state.value,
            first_step=a.first_step,
            last_step=a.last_step,
            resolved_step=a.resolved_step,
            value=a.value,
            baseline=a.baseline,
            best_step=a.best_step,
            rollback_step=a.rollback_step,
            message=a.message,
            fired_at=a.fired_at,
            resolved_at=a.resolved_at,
            repeats=a.repeats,
            delivered=int(sent or 0),
            queued=int(total or 0),
        )
        for a, name, sent, total in session.execute(query)
    ]


def firing_counts(session: Session) -> dict[str, int]:
    """Alerts firing now, for every run (0 for a run with none): what ``evald_alerts_firing`` exports."""
    query = (
        select(Run.name, func.count(Alert.id))
        .outerjoin(Alert, and_(Alert.run_id == Run.id, Alert.state == AlertState.FIRING))
        .group_by(Run.name)
        .order_by(Run.name)
    )
    return {name: int(count) for name, count in session.execute(query)}
