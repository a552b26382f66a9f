"""``/api/v1/runs``: runs, a run's checkpoints, its metric series (smoothed on request), one step's
metrics, and one job's samples and problems."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from daemon.analysis import curves, report
from daemon.analysis.smoothing import parse_smoothing
from daemon.errors import SmoothingError
from daemon.filter_values import INTEGER, MAX_INT
from daemon.web.context import context
from daemon.web.params import PAGE, STEPS, ApiError, Params, bad
from daemon.web.responses import JSON, envelope, page
from daemon.web.routes.common import require_filters, require_run, step_hint
from storage import alerting, queries


def _run_json(row: queries.RunRow, firing: int, config: dict[str, Any] | None) -> dict[str, Any]:
    return {**asdict(row), "firing_alerts": firing, "config": config}


def _run_configs(request: Request) -> dict[str, dict[str, Any]]:
    """Each configured run's ``[[runs]]`` entry as JSON (the dashboard's run table); a run stored in the
    database but no longer in the config has none."""
    return {r.name: r.model_dump(mode="json", exclude={"name"}) for r in context(request).config.runs}


def list_runs(request: Request) -> JSON:
    window = Params.parse(request.query_params, PAGE).page()
    web = context(request)
    with web.session() as session:
        rows = queries.run_rows(session)
        firing = alerting.firing_counts(session)
    chosen = rows[window.offset : window.offset + window.limit]
    configs = _run_configs(request)
    items = [_run_json(r, firing.get(r.name, 0), configs.get(r.name)) for r in chosen]
    return page(request, items, window, more=len(rows) > window.offset + window.limit)


def one_run(request: Request) -> JSON:
    Params.parse(request.query_params, ())
    run = request.path_params["run"]
    with context(request).session() as session:
        require_run(session, run)
        (row,) = queries.run_rows(session, run)
        firing = alerting.firing_counts(session).get(run, 0)
    return JSON(_run_json(row, firing, _run_configs(request).get(run)))


def checkpoints(request: Request) -> JSON:
    window = Params.parse(request.query_params, PAGE).page()
    run = request.path_params["run"]
    with context(request).session() as session:
        require_run(session, run)
        rows = queries.checkpoint_rows(session, run, limit=window.limit + 1, offset=window.offset)
    return page(request, [asdict(r) for r in rows[: window.limit]], window, more=len(rows) > window.limit)


def _best(curve: curves.Curve, better: bool | None) -> dict[str, Any] | None:
    finite = [p for p in curve.points if math.isfinite(p.value)]
    if better is None or not finite:
        return None
    top = max(finite, key=lambda p: p.value if better else -p.value)
    return {"step": top.step, "value": top.value, "checkpoint": top.checkpoint}


def series(request: Request) -> JSON:
    """Every (task, stage, metric) curve of a run, columnar (one array per field), with its best point
    (raw values) and, with ``smooth``, the smoothed values and standard errors of
    ``daemon.analysis.smoothing``."""
    params = Params.parse(request.query_params, ("task", "stage", "metric", "smooth", *STEPS))
    try:
        smoothing = parse_smoothing(params.text("smooth") or "none")
    except SmoothingError as exc:
        raise bad("smooth", str(exc)) from exc
    step_min, step_max = params.step_range()
    task, stage, metric = params.text("task"), params.text("stage"), params.text("metric")
    run = request.path_params["run"]
    web = context(request)
    with web.session() as session:
        require_run(session, run)
        rows = queries.result_rows(
            session, run=run, task=task, stage=stage, metric=metric, step_min=step_min, step_max=step_max
        )
        if not rows:
            require_filters(session, run=run, task=task, stage=stage, metric=metric)
    out = []
    for curve in curves.curves(rows):
        smoothed = curve.smoothed(smoothing)
        out.append(
            {
                "task": curve.task,
                "stage": curve.stage,
                "metric": curve.metric,
                "higher_is_better": web.direction(curve.metric),
                "best": _best(curve, web.direction(curve.metric)),
                "step": curve.steps,
                "value": curve.values,
                "stderr": curve.stderrs,
                "n": [p.n for p in curve.points],
                # The steps whose value is no number because it was computed over no samples (n = 0).
                "no_samples": [p.step for p in curve.points if p.n == 0],
                "checkpoint": [p.checkpoint for p in curve.points],
                # When each result was stored (Unix seconds): the dashboard's wall-time x axes.
                "time": [
                    None if p.evaluated_at is None else p.evaluated_at.timestamp() for p in curve.points
                ],
                "smoothed": (
                    None if smoothed is curve else {"value": smoothed.values, "stderr": smoothed.stderrs}
                ),
            }
        )
    return JSON({"run": run, "smooth": smoothing.spec, "series": out})


def _step(request: Request) -> int:
    raw = str(request.path_params["step"])
    if not INTEGER.fullmatch(raw) or raw.startswith("-") or int(raw) > MAX_INT:
        raise ApiError(404, f"no step {raw[:40]!r}: a step is a non-negative integer")
    return int(raw)


def step_metrics(request: Request) -> JSON:
    """One checkpoint's metrics (every task and stage), the alerts firing at its step (those whose episode,
    onset to last step seen, covers it, not only the ones that began there) and the step's jobs (each
    one's attempts are at ``/api/v1/jobs/{job}``)."""
    Params.parse(request.query_params, ())
    run, step = request.path_params["run"], _step(request)
    with context(request).session() as session:
        require_run(session, run)
        rows = queries.result_rows(session, run=run, step_min=step, step_max=step)
        if not rows:
            steps = [c.step for c in queries.checkpoint_rows(session, run) if c.step is not None]
            raise ApiError(404, f"run {run!r} has no result at step {step} ({step_hint(steps, step)})")
        alerts = [a for a in alerting.alert_rows(session, run=run) if a.seen_at(step)]
        jobs = queries.job_rows(session, run, step=step)
    return JSON(
        {
            "run": run,
            "step": step,
            "checkpoint": rows[0].checkpoint,
            "results": report.result_dicts(rows),
            "alerts": [report.alert_json(a) for a in alerts],
            "jobs": [asdict(j) for j in jobs],
        }
    )


def samples(request: Request) -> JSON:
    """The samples and problems of one job (``evald samples``), ``wrong_only`` keeping those graded wrong."""
    params = Params.parse(request.query_params, ("task", "stage", "wrong_only", *PAGE))
    window = params.page()
    wrong_only = params.boolean("wrong_only")
    stage = params.text("stage")
    run, step = request.path_params["run"], _step(request)
    with context(request).session() as session:
        require_run(session, run)
        task = params.text("task")
        if task is None:
            at_step = queries.result_rows(session, run=run, step_min=step, step_max=step)
            tasks = sorted({r.task for r in at_step})
            if len(tasks) != 1:
                listed = ", ".join(tasks) or "none"
                raise bad("task", f"required: step {step} has {len(tasks)} evaluated tasks ({listed})")
            task = tasks[0]
        try:
            found = queries.job_samples(
                session, run=run, step=step, task=task, stage=stage, wrong_only=wrong_only
            )
        except queries.SamplesUnavailable as exc:
            raise ApiError(404, str(exc)) from exc
    chosen = found.samples[window.offset : window.offset + window.limit]
    more = len(found.samples) > window.offset + window.limit
    body = envelope(request, [report.sample_dict(s) for s in chosen], window, more=more)
    extra = {
        **report.job_fields(found),
        "matching_samples": len(found.samples),
        "wrong_only": wrong_only,
        "problems": [asdict(p) for p in found.problems],
    }
    return JSON({**extra, **body})


def routes() -> list[BaseRoute]:
    return [
        Route("/api/v1/runs", list_runs),
        Route("/api/v1/runs/{run}", one_run),
        Route("/api/v1/runs/{run}/checkpoints", checkpoints),
        Route("/api/v1/runs/{run}/series", series),
        Route("/api/v1/runs/{run}/steps/{step}", step_metrics),
        Route("/api/v1/runs/{run}/steps/{step}/samples", samples),
    ]
