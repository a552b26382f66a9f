"""``/api/v1/alerts``: alerts as ``evald alerts --format json`` prints them, by run and state."""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from daemon.analysis import report
from daemon.web.context import context
from daemon.web.params import PAGE, Params
from daemon.web.responses import JSON, page
from daemon.web.routes.common import require_run
from storage import alerting

STATES = ("firing", "resolved")


def alerts(request: Request) -> JSON:
    params = Params.parse(request.query_params, ("run", "state", *PAGE))
    window = params.page()
    run, state = params.text("run"), params.choice("state", STATES)
    with context(request).session() as session:
        if run is not None:
            require_run(session, run)
        rows = alerting.alert_rows(session, run=run, state=state)
    chosen = rows[window.offset : window.offset + window.limit]
    items = [report.alert_json(r) for r in chosen]
    return page(request, items, window, more=len(rows) > window.offset + window.limit)


def routes() -> list[BaseRoute]:
    return [Route("/api/v1/alerts", alerts)]
