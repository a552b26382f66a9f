"""The app factory: routes by resource, errors as JSON that name the problem, the optional token.

Routes come from ``daemon/web/routes/*.py`` (each module's ``routes()``); add a resource by adding its
module to :data:`ROUTE_MODULES`. Every route is GET (or HEAD): another method is a 405.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from daemon.config import Config
from daemon.web.auth import BearerAuth
from daemon.web.context import WebContext
from daemon.web.params import ApiError
from daemon.web.responses import JSON, error
from daemon.web.routes import alerts, compare, dashboard, jobs, metrics, results, runs, status
from storage.database import Database
from storage.errors import DatabaseUnreachable

log = structlog.get_logger("daemon.web")

#: One module per resource; each has ``routes() -> list[BaseRoute]``.
ROUTE_MODULES: tuple[ModuleType, ...] = (
    runs,
    results,
    alerts,
    compare,
    status,
    jobs,
    dashboard,
    metrics,
)

API_INDEX = {
    "runs": "/api/v1/runs",
    "run": "/api/v1/runs/{run}",
    "checkpoints": "/api/v1/runs/{run}/checkpoints",
    "series": "/api/v1/runs/{run}/series?task=&stage=&metric=&smooth=ema:0.6|window:5",
    "step": "/api/v1/runs/{run}/steps/{step}",
    "samples": "/api/v1/runs/{run}/steps/{step}/samples?task=&stage=&wrong_only=true",
    "results": "/api/v1/results?run=&task=&stage=&metric=&step_min=&step_max=&limit=&offset=",
    "latest": "/api/v1/results/latest?run=",
    "alerts": "/api/v1/alerts?run=&state=firing|resolved",
    "compare": "/api/v1/compare?run_a=&run_b=&task=&stage=&metric=&smooth=&fdr=0.05",
    "status": "/api/v1/status?run=",
    "jobs": "/api/v1/jobs?run=&state=",
    "job": "/api/v1/jobs/{job}",
    "changes": "/api/v1/changes",
}

#: The dashboard loads nothing from elsewhere: scripts, styles and data come from this origin only.
SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        b"frame-ancestors 'none'; form-action 'self'",
    ),
]


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def api_index(_request: Request) -> JSON:
    return JSON({"version": "v1", "endpoints": API_INDEX})


async def _api_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error(exc.status, exc.message, exc.parameter)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error(404, f"no such path {request.url.path[:200]!r} (the API is listed at /api/v1)")
    if exc.status_code == 405:
        # RFC 9110: a 405 names the methods the resource takes (Starlette's routes put them in ``Allow``).
        # Starlette keeps a route's methods in a set: listed in one order, whatever the hash seed.
        given = ((exc.headers or {}).get("Allow") or "GET, HEAD").split(",")
        order = ("GET", "HEAD", "POST")
        allowed = ", ".join(
            sorted({m.strip() for m in given}, key=lambda m: (order.index(m) if m in order else 9, m))
        )
        message = f"{request.method[:10]} is not allowed here ({allowed}): the service is read-only"
        return error(405, message, headers={"Allow": allowed})
    return error(exc.status_code, str(exc.detail))


async def _unavailable(_request: Request, exc: Exception) -> Response:
    log.warning("web.db_unavailable", error=str(exc)[:300])
    return error(503, "the database is unavailable; try again shortly")


async def _internal(request: Request, exc: Exception) -> Response:
    # Logged here with its type; the client learns nothing of SQL, paths or stack frames.
    log.error("web.internal_error", path=request.url.path[:200], error_type=type(exc).__name__)
    return error(500, "internal error (logged by the server)")


def create_app(
    config: Config,
    *,
    database: Database | None = None,
    token: str | None = None,
    extra_routes: Callable[[], list[BaseRoute]] | None = None,
) -> Starlette:
    """The ASGI app. ``database`` defaults to the config's, opened read-only; ``token`` (from
    ``[web] token_env``) makes every request need it."""
    db = database if database is not None else Database(config.database.url, read_only=True)
    routes: list[BaseRoute] = [Route("/api/v1", api_index), Route("/api/v1/", api_index)]
    for module in ROUTE_MODULES:
        routes.extend(module.routes())
    if extra_routes is not None:
        routes.extend(extra_routes())
    middleware = [Middleware(SecurityHeaders)]
    if token is not None:
        middleware.append(Middleware(BearerAuth, token=token))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            DatabaseUnreachable: _unavailable,
            Exception: _internal,
        },
    )
    app.state.web = WebContext(config=config, database=db, token=token)
    return app
