"""What a result filter may name: the tasks, stages and metrics a run (or every run) has results for.

``evald results`` and the HTTP API both refuse a filter that names nothing that exists, listing what
does; an empty answer to a filter that does exist (a step range past the newest step) stays an empty
answer. The lookup runs only when a filtered query came back empty, so a normal answer pays nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from storage.tables import CHECKPOINTS, EVAL_JOBS, RESULTS, RUNS

if TYPE_CHECKING:
    from sqlalchemy import Connection
    from sqlalchemy.orm import Session

#: The filters in the order they narrow one another: a stage is looked up among the named task's.
FIELDS = ("task", "stage", "metric")


#: How many known names a message lists.
LISTED = 20


@dataclass(frozen=True)
class UnknownFilter:
    """A filter value with no stored result: which filter, what it asked for, what exists instead, and
    where that was looked up (the run, and the filters before this one)."""

    field: str
    wanted: str
    known: list[str]
    run: str | None
    scope: dict[str, str]

    def message(self) -> str:
        """``run 'a' (task 'x') has no metric 'm' (metrics: accuracy, wall_s)``; without a run, ``no stored
        result (task 'x') has metric 'm' (metrics: ...)``."""
        scope = ""
        if self.scope:
            scope = " (" + ", ".join(f"{f} {v[:200]!r}" for f, v in self.scope.items()) + ")"
        shown = ", ".join(self.known[:LISTED]) or "none"
        if len(self.known) > LISTED:
            shown += f" and {len(self.known) - LISTED} more"
        wanted = f"{self.field} {self.wanted[:200]!r} ({self.field}s: {shown})"
        if self.run is None:
            return f"no stored result{scope} has {wanted}"
        return f"run {self.run[:200]!r}{scope} has no {wanted}"


def unknown_filter(
    session: Session | Connection,
    *,
    run: str | None,
    task: str | None = None,
    stage: str | None = None,
    metric: str | None = None,
) -> UnknownFilter | None:
    """The first of ``task``, ``stage``, ``metric`` that no result of ``run`` (any run when None) has,
    each looked up among the results the filters before it leave; None when every given one exists."""
    wanted = {"task": task, "stage": stage, "metric": metric}
    if all(v is None for v in wanted.values()):
        return None
    query = (
        select(EVAL_JOBS.c.task, EVAL_JOBS.c.stage, RESULTS.c.metric)
        .distinct()
        .select_from(RESULTS)
        .join(EVAL_JOBS, RESULTS.c.job_id == EVAL_JOBS.c.id)
        .join(CHECKPOINTS, EVAL_JOBS.c.checkpoint_id == CHECKPOINTS.c.id)
    )
    if run is not None:
        query = query.join(RUNS, CHECKPOINTS.c.run_id == RUNS.c.id).where(RUNS.c.name == run)
    keys = [tuple(map(str, row)) for row in session.execute(query)]
    scope: dict[str, str] = {}
    for position, field in enumerate(FIELDS):
        value = wanted[field]
        if value is None:
            continue
        have = sorted({key[position] for key in keys})
        if value not in have:
            return UnknownFilter(field, value, have, run, scope)
        keys = [key for key in keys if key[position] == value]
        scope = {**scope, field: value}
    return None
