"""One run's stored results, narrowed to a task, stage or metric: what each analysis of a run starts from.

``evald compare``, ``evald plot`` and ``evald export`` read a run through :func:`run_results`, so a name
that matches nothing is refused the same way everywhere, with what exists.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from daemon.errors import EvaldError
from storage import queries


def run_results(
    session: Session,
    run: str,
    *,
    task: str | None = None,
    stage: str | None = None,
    metric: str | None = None,
) -> list[queries.ResultRow]:
    """One run's stored results, narrowed; an unknown run, task, stage or metric is an error that names
    what exists."""
    rows = queries.result_rows(session, run=run)
    if not rows:
        known = ", ".join(r.name for r in queries.run_rows(session) if r.evaluated_step is not None) or "none"
        raise EvaldError(f"run {run!r} has no stored results (runs with results: {known})")
    for field, wanted in (("task", task), ("stage", stage), ("metric", metric)):
        if wanted is None:
            continue
        have = sorted({str(getattr(r, field)) for r in rows})
        if wanted not in have:
            raise EvaldError(f"run {run!r} has no {field} {wanted!r} here (its {field}s: {', '.join(have)})")
        rows = [r for r in rows if getattr(r, field) == wanted]
    return rows
