"""``/api/v1/status`` (as ``evald status --format json``: queue, deferred and skipped with reasons),
``/api/v1/jobs`` (every job, by run and state) and ``/api/v1/changes`` (what a live page polls)."""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from daemon.analysis import report
from daemon.scheduling.policy import schedule_summary
from daemon.web.context import context
from daemon.web.params import PAGE, Params
from daemon.web.responses import JSON, page
from daemon.web.routes.common import require_run
from storage import queries, scheduling
from storage.models import JobState

STATES = tuple(s.value for s in JobState)


def status(request: Request) -> JSON:
    """Per run: checkpoints and jobs by state, the schedule, the queue, deferred jobs and skipped
    checkpoints with their reasons. Runs are the config's plus any other the database holds."""
    params = Params.parse(request.query_params, ("run",))
    run = params.text("run")
    web = context(request)
    with web.session() as session:
        if run is not None:
            require_run(session, run)
        checkpoints = queries.checkpoint_rows(session, run)
        jobs = queries.job_rows(session, run)
        plans = scheduling.plan_rows(session, run)
        stored = scheduling.schedules(session)
        names = [r.name for r in queries.run_rows(session, run)]
    schedules = {
        r.name: schedule_summary(web.config.scheduling, r, stored[r.name])
        for r in web.config.runs
        if r.name in stored and r.name in names
    }
    max_attempts = web.config.inference.max_attempts
    return JSON({"runs": report.status(checkpoints, jobs, names, plans, schedules, max_attempts)})


def jobs(request: Request) -> JSON:
    params = Params.parse(request.query_params, ("run", "state", *PAGE))
    window = params.page()
    run, state = params.text("run"), params.choice("state", STATES)
    with context(request).session() as session:
        if run is not None:
            require_run(session, run)
        rows = [j for j in queries.job_rows(session, run) if state is None or j.state == state]
    chosen = rows[window.offset : window.offset + window.limit]
    return page(request, [asdict(j) for j in chosen], window, more=len(rows) > window.offset + window.limit)


def changes(request: Request) -> JSON:
    Params.parse(request.query_params, ())
    with context(request).session() as session:
        marks = queries.change_marks(session)
    return JSON({"version": "-".join(map(str, marks))})


def routes() -> list[BaseRoute]:
    return [
        Route("/api/v1/status", status),
        Route("/api/v1/jobs", jobs),
        Route("/api/v1/changes", changes),
    ]
