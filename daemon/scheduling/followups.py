"""What a stored result sets off in planning: a quick stage's full stage, and the adaptive interval.

Run in the result's transaction (:meth:`daemon.scheduling.planner.Planner.after_result`); the rules are
:mod:`daemon.scheduling.stages` and :mod:`daemon.scheduling.adaptive`, pure, and this module reads their
points from the database and writes what they decide.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime

import structlog
from sqlalchemy.orm import Session

from daemon.config import SchedulingConfig, TwoStageConfig
from daemon.scheduling import adaptive, stages
from daemon.scheduling.enqueue import enqueue_full
from daemon.scheduling.policy import RunPolicy
from inference.metrics import higher_is_better
from storage import queries
from storage import scheduling as store

log = structlog.get_logger("evald.planner")


def after_result(
    session: Session,
    policy: RunPolicy,
    scheduling: SchedulingConfig,
    job: queries.ClaimedJob,
    metrics: Sequence[queries.MetricRow],
    clock: Callable[[], datetime],
) -> int:
    """Follow-ups of a stored result of one of ``policy``'s jobs; returns how many jobs were created.

    In a savepoint: a failure here is logged and undone, and the result itself still commits.
    """
    stage_config = scheduling.two_stage.get(job.task)
    settings = policy.config.adaptive
    watched_stage = stages.QUICK if stage_config is not None else stages.FULL
    quick = job.stage == stages.QUICK and stage_config is not None
    adapt = settings is not None and job.task == settings.task and job.stage == watched_stage
    if not (quick or adapt):
        return 0
    values = {m.name: m for m in metrics}
    try:
        with session.begin_nested():
            # The run's counters first, as planning passes lock them: one lock order, no deadlock.
            schedule = store.load_schedule(session, policy.run_id)
            created = 0
            if quick and stage_config is not None:
                created = _full_after_quick(session, policy, job, stage_config, values)
            if adapt:
                _adapt(session, policy, schedule, job, values, clock)
            return created
    except Exception as exc:
        log.exception("planner.after_result_failed", job_id=job.id, run=job.run, error=repr(exc))
        return 0


def _series(
    session: Session, policy: RunPolicy, job: queries.ClaimedJob, metric: str
) -> tuple[list[adaptive.Point], adaptive.Point | None]:
    """The metric's earlier points (steps below the job's) and the job's own point."""
    points = store.metric_series(session, run_id=policy.run_id, task=job.task, stage=job.stage, metric=metric)
    mine = [p for p in points if p.step == job.step]
    earlier = [p for p in points if p.step is not None and job.step is not None and p.step < job.step]
    current = adaptive.Point(job.step, mine[-1].value, mine[-1].stderr) if mine else None
    return [adaptive.Point(p.step, p.value, p.stderr) for p in earlier], current


def _full_after_quick(
    session: Session,
    policy: RunPolicy,
    job: queries.ClaimedJob,
    stage_config: TwoStageConfig,
    values: dict[str, queries.MetricRow],
) -> int:
    metric = stage_config.watch_metric
    value = values.get(metric)
    if value is None:
        return 0
    history, _ = _series(session, policy, job, metric)
    why = stages.full_after_quick(
        history,
        adaptive.Point(job.step, value.value, value.stderr),
        metric=metric,
        higher_is_better=higher_is_better(metric),
        sigmas=stage_config.anomaly_sigmas,
    )
    if why is None:
        return 0
    return enqueue_full(session, policy, job.checkpoint_id, job.step, job.task, why)


def _adapt(
    session: Session,
    policy: RunPolicy,
    schedule: store.Schedule,
    job: queries.ClaimedJob,
    values: dict[str, queries.MetricRow],
    clock: Callable[[], datetime],
) -> None:
    settings = policy.config.adaptive
    assert settings is not None
    value = values.get(settings.metric)
    if value is None or job.step is None:
        return
    points = store.metric_series(
        session, run_id=policy.run_id, task=job.task, stage=job.stage, metric=settings.metric
    )
    if any(p.step is not None and p.step > job.step for p in points):
        return  # a backfilled older checkpoint says nothing about where the run is now
    earlier = [p for p in points if p.step is not None and p.step < job.step]
    if not earlier or not math.isfinite(value.value):
        return
    current_every = policy.effective(schedule).steps
    assert current_every is not None
    interval = adaptive.adapt(
        current_every,
        adaptive.Point(earlier[-1].step, earlier[-1].value, earlier[-1].stderr),
        adaptive.Point(job.step, value.value, value.stderr),
        metric=settings.metric,
        min_every=settings.min_every_steps,
        max_every=settings.max_every_steps,
        sigmas=settings.noise_sigmas,
    )
    schedule.every_steps = interval.every_steps
    schedule.every_reason = interval.reason
    store.save_schedule(session, schedule, clock())
    log.info("schedule.adapted", run=policy.name, every_steps=interval.every_steps, reason=interval.reason)
