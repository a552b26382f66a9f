"""The pieces every rendering shares: a value as a table cell, aligned tables, text cut to one line."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

Format = Literal["table", "json", "csv"]

#: The value cell of a metric over no samples (``n = 0``), in tables and status.
NO_SAMPLES = "no samples"


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1e6:
            # Six significant digits: a perplexity of 1.8e29 has no meaningful 30th digit to print.
            return f"{value:.6g}"
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    return "\n".join(lines)


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with its whitespace runs made single spaces, cut to ``limit`` characters if given."""
    flat = " ".join(text.split())
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


def first_line(text: str, limit: int) -> tuple[str, int]:
    """The first line of ``text`` (whitespace runs made single spaces) cut to ``limit`` characters with
    "…", and how many lines follow it: a multi-line error (a crashed worker's log tail) shown where one
    line fits, the rest left to where the whole text is shown."""
    lines = text.strip().splitlines() or [""]
    head = " ".join(lines[0].split())
    cut = head if len(head) <= limit else head[: max(1, limit - 1)] + "…"
    return cut, len(lines) - 1


def duration(seconds: float) -> str:
    """``45s``, ``4m 12s``, ``3h 05m``, ``2d 4h``: a wait or an age at a glance."""
    whole = int(max(0.0, seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"
