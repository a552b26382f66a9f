"""The optional bearer token: when ``[web] token_env`` is set, every request carries it.

API clients send ``Authorization: Bearer <token>``. A browser cannot add a header to a page load, so
``/login`` (a form that shows nothing of the database) takes the token once and sets it as an
``HttpOnly``, ``SameSite=Strict`` cookie that later requests carry instead. Tokens are compared in
constant time and never logged.
"""

from __future__ import annotations

import hmac
from http.cookies import SimpleCookie
from urllib.parse import parse_qs

import structlog
from starlette.responses import HTMLResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from daemon.web.responses import error

log = structlog.get_logger("daemon.web.auth")

COOKIE = "evald_token"
LOGIN = "/login"
#: The login page's stylesheet: the one other path open without the token (it holds only the form's styles).
LOGIN_STYLES = "/login.css"
#: A login form body is a token and nothing else: anything larger is refused unread.
MAX_LOGIN_BYTES = 4096

LOGIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>evald: sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/login.css"></head><body class="login">
<form method="post" action="/login"><h1>evald</h1><p>{message}</p>
<label>Token <input type="password" name="token" autofocus autocomplete="current-password"></label>
<button type="submit">Open the dashboard</button></form></body></html>"""


def _matches(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


def _presented(scope: Scope) -> tuple[str | None, str | None]:
    bearer = cookie = None
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                bearer = credentials.strip()
        elif name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:
                continue
            if COOKIE in jar:
                cookie = jar[COOKIE].value
    return bearer, cookie


class BearerAuth:
    """ASGI middleware: 401 (API) or a redirect to the login form (pages) without the token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == LOGIN:
            await self._login(scope, receive, send)
            return
        if path == LOGIN_STYLES:
            await self.app(scope, receive, send)
            return
        bearer, cookie = _presented(scope)
        if _matches(bearer, self.token) or _matches(cookie, self.token):
            await self.app(scope, receive, send)
            return
        log.info("web.unauthorized", path=path[:200], had_token=bearer is not None or cookie is not None)
        if path.startswith(("/api/", "/metrics")) or path == "/api":
            response = error(401, "a bearer token is required (Authorization: Bearer <token>)")
            response.headers["WWW-Authenticate"] = 'Bearer realm="evald"'
            await response(scope, receive, send)
            return
        await _html(303, "", {"location": LOGIN})(scope, receive, send)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] in ("GET", "HEAD"):
            page = LOGIN_PAGE.format(message="This evald needs its access token.")
            await _html(200, page)(scope, receive, send)
            return
        if scope["method"] != "POST":
            allow = {"Allow": "GET, HEAD, POST"}
            refused = error(405, "only GET and POST are allowed on /login", headers=allow)
            await refused(scope, receive, send)
            return
        body = b""
        while True:
            message: Message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_LOGIN_BYTES:
                await error(413, "login form too large")(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        given = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0]
        if not _matches(given, self.token):
            log.info("web.login_refused")
            await _html(401, LOGIN_PAGE.format(message="Wrong token."))(scope, receive, send)
            return
        response = _html(303, "", {"location": "/"})
        response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict", path="/")
        await response(scope, receive, send)


def _html(status: int, body: str, headers: dict[str, str] | None = None) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=headers)
