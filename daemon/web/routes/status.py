"""``/api/v1/status`` (as ``evald status --format json``: queue, deferred, held and skipped with reasons,
jobs waiting in Slurm's queue and for how long, the trackers' backlogs),
``/api/v1/jobs`` (every job, by run and state) and ``/api/v1/changes`` (what a live page polls)."""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from daemon.analysis.run_status import executor_summary, run_summaries, tracker_summaries
from daemon.web.context import context
from daemon.web.params import PAGE, Params
from daemon.web.responses import JSON, page
from daemon.web.routes.common import require_run
from storage import queries
from storage.models import JobState

STATES = tuple(s.value for s in JobState)


def status(request: Request) -> JSON:
    """Per run: checkpoints and jobs by state, the schedule, the queue, deferred and held jobs and
    skipped checkpoints with their reasons, jobs in Slurm's queue with their wait so far; and each
    tracker's backlog. Runs are the config's plus any other the database holds."""
    params = Params.parse(request.query_params, ("run",))
    run = params.text("run")
    web = context(request)
    with web.session() as session:
        if run is not None:
            require_run(session, run)
        names = [r.name for r in queries.run_rows(session, run)]
        runs = run_summaries(session, web.config, names, run)
        trackers = tracker_summaries(session, web.config)
        executor = executor_summary(session, web.config)
    return JSON({"executor": executor, "runs": runs, "trackers": trackers})


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
