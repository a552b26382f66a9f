"""Every run's status read from the database, as ``evald status`` and ``/api/v1/status`` show it, and the
executor's controller as the daemons last saw it (:func:`executor_summary`).

What is stored (checkpoints, jobs, plans, schedules, ignored and alternate folders, the newest results)
is assembled by :func:`daemon.analysis.report.status`, with the scheduler's view of jobs handed to Slurm
(waiting in its queue, and how long so far, or running); the trackers' backlogs come from the outbox.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
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


#: The events a daemon stores as its executor's controller stops answering and answers again
#: (daemon.running.dispatch), oldest first; their message is JSON (daemon.running.executor_watch).
OUTAGE_KINDS = ("executor_unreachable", "executor_reachable")


def executor_summary(session: Session, config: Config) -> dict[str, Any] | None:
    """The configured executor's controller (a Ray head, Slurm's controller) as the daemons last said it:
    ``reachable`` False with what is away, since when, for how long now, its error and the daemon that saw
    it (which pauses claiming and knows its jobs' states no more until it answers); True once it answered
    again; None before any word. None for the local executor, which has no controller."""
    if config.executor.kind == "local":
        return None
    latest: tuple[str, dict[str, Any]] | None = None
    for row in scheduling.events(session, kinds=OUTAGE_KINDS):
        try:
            said = json.loads(row.message)
        except ValueError:
            continue
        if isinstance(said, dict) and said.get("executor") == config.executor.kind:
            latest = (row.kind, said)
    out: dict[str, Any] = {"kind": config.executor.kind, "reachable": None}
    if latest is None:
        return out
    kind, said = latest
    if kind == "executor_reachable":
        return {**out, "reachable": True, "what": said.get("what"), "since": said.get("at")}
    since = str(said.get("since") or "")
    try:
        began = datetime.fromisoformat(since)
        away_s: float | None = max(0.0, (database_now(session) - began).total_seconds())
    except (TypeError, ValueError):
        away_s = None
    return {
        **out,
        "reachable": False,
        "what": said.get("what"),
        "since": since or None,
        "away_s": None if away_s is None else round(away_s, 1),
        "error": said.get("error"),
        "daemon": said.get("daemon"),
        "claiming": "paused",
    }
