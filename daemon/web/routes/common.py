"""Lookups several routes share: a run that must exist, and the steps a run has."""

from __future__ import annotations

from sqlalchemy.orm import Session

from daemon.web.params import ApiError, check_text
from storage import queries
from storage.queries.filters import unknown_filter

#: How many names or steps a 404 lists.
LISTED = 20


def listing(names: list[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"


def require_run(session: Session, run: str) -> None:
    """Nothing if the run exists, else a 404 naming the runs that do."""
    check_text("run", run)
    if not queries.run_exists(session, run):
        known = [r.name for r in queries.run_rows(session)]
        raise ApiError(404, f"no run {run[:200]!r} (runs: {listing(known)})")


def require_filters(
    session: Session, *, run: str | None, task: str | None, stage: str | None, metric: str | None
) -> None:
    """Nothing if every given filter names something stored, else a 404 naming what exists (called when
    an answer came back empty: a filter that exists but matches nothing there is an empty list)."""
    unknown = unknown_filter(session, run=run, task=task, stage=stage, metric=metric)
    if unknown is None:
        return
    raise ApiError(404, unknown.message(), parameter=unknown.field)


def step_hint(steps: list[int], step: int) -> str:
    if not steps:
        return "it has no checkpoint with a step yet"
    nearest = sorted(sorted(set(steps), key=lambda s: (abs(s - step), s))[:5])
    return f"nearest steps: {', '.join(map(str, nearest))} (of {len(set(steps))})"
