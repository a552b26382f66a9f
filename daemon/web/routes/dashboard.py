"""The dashboard: one HTML page and its static files (shipped in the wheel), no build step.

``/static`` is Starlette's ``StaticFiles``, which resolves every path inside its folder and answers 404
for anything that leaves it (``..``, encoded or not, absolute paths, symlinks out).
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "static"


def index(_request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})


def login_styles(_request: Request) -> Response:
    # Open without the token (daemon.web.auth lets this one path through): the login form's own styles.
    return FileResponse(STATIC / "login.css", headers={"cache-control": "no-cache"})


def favicon(_request: Request) -> Response:
    return RedirectResponse("/static/favicon.svg", status_code=308)


def routes() -> list[BaseRoute]:
    return [
        Route("/", index),
        Route("/favicon.ico", favicon),
        Route("/login.css", login_styles),
        Mount("/static", app=StaticFiles(directory=STATIC, follow_symlink=False), name="static"),
    ]
