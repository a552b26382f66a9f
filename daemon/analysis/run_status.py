"""Every run's status read from the database, as ``evald status`` and ``/api/v1/status`` show it.

What is stored (checkpoints, jobs, plans, schedules, ignored and alternate folders, the newest results)
is assembled by :func:`daemon.analysis.report.status`, with the scheduler's view of jobs handed to Slurm
(waiting in its queue, and how long so far, or running); the trackers' backlogs come from the outbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from daemon.analysis import report
from daemon.analysis.report.tracker_rows import TrackerRef, trackers
from daemon.config import ENDPOINT_PREFIX, Config
from daemon.scheduling.policy import schedule_summary
from storage import queries, scheduling
from storage.queries import executor_states
from storage.queries.claims import database_now
from storage.queries.monitoring import outbox_backlog


def run_summaries(
    session: Session, config: Config, names: Sequence[str], run: str | None = None
) -> dict[str, Any]:
    """``report.status``'s summary of the runs ``names`` (all read, or only ``run``'s rows), with each job
    handed to Slurm placed in its queue or on its nodes (:func:`report.with_scheduler`)."""
    checkpoints = queries.checkpoint_rows(session, run)
    jobs = queries.job_rows(session, run)
    plans = scheduling.plan_rows(session, run)
    stored = scheduling.schedules(session)
    ignored = queries.ignored_rows(session)
    alternates = queries.alternate_rows(session)
    scheduled = executor_states(session)
    latest = queries.latest_results(session, run=run)
    now = database_now(session)
    schedules = {
        r.name: schedule_summary(config.scheduling, r, stored[r.name])
        for r in config.runs
        if r.name in stored and r.name in names
    }
    runs = report.status(
        checkpoints, jobs, names, plans, schedules, config.inference.max_attempts, ignored, alternates, latest
    )
    if scheduled:
        runs = report.with_scheduler(runs, scheduled, now)
    return runs


def tracker_summaries(session: Session, config: Config) -> list[dict[str, Any]]:
    """Each configured tracker's backlog and whether its deliveries fail, then any tracker endpoint of
    the outbox no configured tracker owns that still has messages waiting."""
    # A tracker's target (where it sends now) where the config has one: its rows for another wait apart.
    refs = [TrackerRef(t.name, t.kind, t.endpoint, getattr(t, "target", None)) for t in config.trackers]
    return trackers(refs, outbox_backlog(session, ENDPOINT_PREFIX), database_now(session))
