"""``/api/v1/compare``: two runs at matched steps, as ``evald compare --format json`` prints them.

The same call as the CLI's (:func:`daemon.analysis.compare.compare_runs`, then
:func:`daemon.analysis.report.comparison`): one query and one comparison, the command line and the
dashboard only render it differently.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from daemon.analysis import report
from daemon.analysis.compare import compare_runs
from daemon.analysis.significance import FDR
from daemon.analysis.smoothing import parse_smoothing
from daemon.errors import EvaldError, SmoothingError
from daemon.web.context import context
from daemon.web.params import ApiError, Params, bad
from daemon.web.responses import JSON
from daemon.web.routes.common import require_run
from storage.queries.filters import unknown_filter

ACCEPTED = ("run_a", "run_b", "task", "stage", "metric", "smooth", "fdr")


def _runs(params: Params) -> tuple[str, str]:
    names = []
    for name in ("run_a", "run_b"):
        value = params.text(name)
        if value is None:
            raise bad(name, "required: the two runs to compare (run_a=A&run_b=B, as --run A --run B)")
        names.append(value)
    return names[0], names[1]


def _check_names(request: Request, runs: tuple[str, str], filters: dict[str, str | None]) -> None:
    """404 for a run that does not exist or a filter one of the runs has no result for, naming the
    parameter (``evald compare`` says the same words, without a parameter to name)."""
    with context(request).session() as session:
        for parameter, run in zip(("run_a", "run_b"), runs, strict=True):
            try:
                require_run(session, run)
            except ApiError as exc:
                raise ApiError(404, exc.message, parameter=parameter) from None
            unknown = unknown_filter(
                session, run=run, task=filters["task"], stage=filters["stage"], metric=filters["metric"]
            )
            if unknown is not None:
                raise ApiError(404, unknown.message(), parameter=unknown.field)


def compare(request: Request) -> JSON:
    """Run B against run A at their matched steps, each point tested, verdicts at ``fdr``."""
    params = Params.parse(request.query_params, ACCEPTED)
    run_a, run_b = _runs(params)
    try:
        smoothing = parse_smoothing(params.text("smooth") or "none")
    except SmoothingError as exc:
        raise bad("smooth", str(exc)) from exc
    fdr = params.fraction("fdr", FDR)
    task, stage, metric = params.text("task"), params.text("stage"), params.text("metric")
    _check_names(request, (run_a, run_b), {"task": task, "stage": stage, "metric": metric})
    try:
        found = compare_runs(
            context(request).database,
            run_a,
            run_b,
            task=task,
            stage=stage,
            metric=metric,
            smoothing=smoothing,
            fdr=fdr,
        )
    except EvaldError as exc:
        # A run that exists with no stored result yet: the CLI's message, which lists the runs that have.
        raise ApiError(404, str(exc)) from exc
    # The CLI's JSON itself, read back: the API cannot drift from `evald compare --format json`.
    body: dict[str, Any] = json.loads(report.comparison(found, "json"))
    return JSON(body)


def routes() -> list[BaseRoute]:
    return [Route("/api/v1/compare", compare)]
