"""JSON bodies: strict JSON (NaN and infinities become null), and the page envelope of list routes."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from daemon.web.params import Page


def _strict(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        try:
            text = json.dumps(content, separators=(",", ":"), allow_nan=False, default=_default)
        except ValueError:
            # Browsers' JSON.parse rejects NaN: a non-finite value is sent as null (the value is unknown).
            # Walking every value costs more than encoding it, so only a body that holds one pays for it.
            text = json.dumps(_strict(content), separators=(",", ":"), allow_nan=False, default=_default)
        return text.encode("utf-8")


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def error(
    status: int, message: str, parameter: str | None = None, *, headers: dict[str, str] | None = None
) -> JSON:
    body: dict[str, Any] = {"error": message, "status": status}
    if parameter is not None:
        body["parameter"] = parameter
    return JSON(body, status_code=status, headers=headers)


def envelope(request: Request, items: Sequence[Any], window: Page, *, more: bool) -> dict[str, Any]:
    """A page's fields: ``items``, and ``next``, the URL of the following page (null on the last)."""
    following = None
    if more:
        url = request.url.include_query_params(offset=window.offset + window.limit, limit=window.limit)
        following = url.path + "?" + url.query
    return {
        "items": list(items),
        "limit": window.limit,
        "offset": window.offset,
        "next_offset": window.offset + window.limit if more else None,
        "next": following,
    }


def page(request: Request, items: Sequence[Any], window: Page, *, more: bool) -> JSON:
    return JSON(envelope(request, items, window, more=more))
