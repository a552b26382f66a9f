"""``/api/v1/results``: result rows as ``evald results --format json`` prints them, filtered and paged;
``/api/v1/results/latest``: each series' newest row."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from daemon.analysis import report
from daemon.web.context import context
from daemon.web.params import PAGE, STEPS, Params
from daemon.web.responses import page
from daemon.web.routes.common import require_filters, require_run
from storage import queries

FILTERS = ("run", "task", "stage", "metric", *STEPS)


def results(request: Request) -> object:
    params = Params.parse(request.query_params, (*FILTERS, *PAGE))
    window = params.page()
    run = params.text("run")
    step_min, step_max = params.step_range()
    task, stage, metric = params.text("task"), params.text("stage"), params.text("metric")
    with context(request).session() as session:
        if run is not None:
            require_run(session, run)
        rows = queries.result_rows(
            session,
            run=run,
            task=task,
            stage=stage,
            metric=metric,
            step_min=step_min,
            step_max=step_max,
            limit=window.limit + 1,
            offset=window.offset,
        )
        if not rows:
            require_filters(session, run=run, task=task, stage=stage, metric=metric)
    return page(request, report.result_dicts(rows[: window.limit]), window, more=len(rows) > window.limit)


def latest(request: Request) -> object:
    params = Params.parse(request.query_params, ("run", *PAGE))
    window = params.page()
    run = params.text("run")
    with context(request).session() as session:
        if run is not None:
            require_run(session, run)
        rows = queries.latest_results(session, run=run)
    chosen = rows[window.offset : window.offset + window.limit]
    return page(request, report.result_dicts(chosen), window, more=len(rows) > window.offset + window.limit)


def routes() -> list[BaseRoute]:
    return [Route("/api/v1/results", results), Route("/api/v1/results/latest", latest)]
