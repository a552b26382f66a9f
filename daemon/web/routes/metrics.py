"""``GET /metrics``: the Prometheus scrape endpoint (collector in :mod:`daemon.web.metrics`).

Behind the same bearer token as the API when one is set (Prometheus sends it with
``authorization: {credentials: ...}`` in its scrape config).
"""

from __future__ import annotations

import structlog
from prometheus_client.exposition import choose_encoder
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from daemon.web.context import context
from daemon.web.metrics import registry, scope_of
from storage.errors import StorageError

log = structlog.get_logger("daemon.web")


async def metrics(request: Request) -> Response:
    # The text format 0.0.4, or OpenMetrics when the scraper asks for it (Prometheus does).
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    # A registry per scrape costs nothing (it holds no state); the collector reads the database.
    web = context(request)
    scope = scope_of(
        [r.name for r in web.config.runs],
        web.config.web.metrics_window_secs,
        [w.name for w in web.config.webhooks],
    )
    found = registry(web.database, scope)
    try:
        # The queries block: off the event loop, so a slow scrape does not stall the API.
        body = await run_in_threadpool(encoder, found)
    except (SQLAlchemyError, StorageError) as exc:
        # The driver's words (host, database, statement) go to the log, not to whoever scrapes.
        reason = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
        log.warning("metrics.scrape_failed", error_type=type(exc).__name__, error=reason)
        return PlainTextResponse(
            f"evald: cannot read the database ({type(exc).__name__}); the service log has the reason\n",
            status_code=503,
        )
    return Response(body, media_type=content_type)


def routes() -> list[BaseRoute]:
    return [Route("/metrics", metrics, methods=["GET"])]
