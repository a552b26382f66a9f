"""``/api/v1/jobs/{job}``: one job and its attempts, as ``evald history --format json`` shows them.

The API is read-only (every route is GET; its database is opened read-only): a job is retried with
``evald retry``, and here a retried job shows its earlier attempts, then its new one.
"""

from __future__ import annotations

from dataclasses import asdict

from starlette.requests import Request
from starlette.routing import BaseRoute, Route

from daemon.analysis.report.job_history import history_rows
from daemon.filter_values import ValueRefused, parse_integer
from daemon.web.context import context
from daemon.web.params import ApiError, Params
from daemon.web.responses import JSON
from storage import queries
from storage.queries.retry import job_submission


def _job_id(request: Request) -> int:
    raw = str(request.path_params["job"])
    try:
        return parse_integer(raw, minimum=1)
    except ValueRefused as exc:
        raise ApiError(404, f"no job {raw[:40]!r}: a job id is a positive integer ({exc})") from None


def one_job(request: Request) -> JSON:
    Params.parse(request.query_params, ())
    job_id = _job_id(request)
    with context(request).session() as session:
        current = job_submission(session, job_id)
        if current is None:
            raise ApiError(404, f"no job {job_id} (the jobs are listed at /api/v1/jobs)")
        attempts = queries.job_history(session, job_id)
        # The run's rows: job_rows has no filter by id, and a run's jobs are few enough to read.
        (row,) = [j for j in queries.job_rows(session, current.run) if j.id == job_id]
    return JSON({"job": asdict(row), "attempts": history_rows(attempts, current)})


def routes() -> list[BaseRoute]:
    return [Route("/api/v1/jobs/{job}", one_job)]
