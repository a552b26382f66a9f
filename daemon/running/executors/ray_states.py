"""What the Ray executor makes of a Ray job's state and its folder: pure functions over the Jobs API's
answer and the files the driver wrote (``ray_state.json``, ``exit.json``, the logs).

A Ray job and its driver's files, and the attempt's status::

    PENDING                               pending (Ray's message: the supervisor waits for the head)
    RUNNING, ray_state placing            pending ("waiting for resources: 2 bundles {CPU: 1} (STRICT_PACK;
                                          placement group NO_RESOURCES)"; INFEASIBLE: since when, and
                                          when the job fails for it)
    RUNNING, ray_state running            running (on the bundles' nodes)
    exit.json end = succeeded             SUCCEEDED when result.json holds no error, else FAILED
    exit.json end = failed                FAILED (OUT_OF_MEMORY for the worker's exit status 4), the
                                          failed rank's log tail
    exit.json node_fail / out_of_memory / timeout / lost / infeasible     that end
    STOPPED, or end = cancelled           CANCELLED (by evald when it stopped it: cancelled.json)
    FAILED without exit.json              Ray's error type: the supervisor died NODE_FAIL, else FAILED
                                          with the job log's tail (a driver that could not start)
    unknown to Ray (its head restarted)   the folder's end, else SUCCEEDED for a result, else LOST
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from daemon.running.executors.base import Active, Ended, EndKind, Handle, Phase, Placement, Status
from daemon.running.executors.ray_client import RayJob
from daemon.running.workers import stderr_tail
from inference.spec import EXIT_OUT_OF_MEMORY, JobResult

STATE_NAME = "ray_state.json"
EXIT_NAME = "exit.json"
LOG_NAME = "worker.log"
DRIVER_LOG = "driver.log"

#: The Jobs API's logs of a job, by submission id.
Logs = Callable[[str], str]

_ENDS = {
    "failed": EndKind.FAILED,
    "node_fail": EndKind.NODE_FAIL,
    "out_of_memory": EndKind.OUT_OF_MEMORY,
    "timeout": EndKind.TIMEOUT,
    "lost": EndKind.LOST,
    "cancelled": EndKind.CANCELLED,
    "infeasible": EndKind.INFEASIBLE,
}
#: Ray's word on a job that failed before its driver wrote an end, and what it means for the attempt.
_RAY_ERRORS = {
    "JOB_SUPERVISOR_ACTOR_DIED": EndKind.NODE_FAIL,
    "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE": EndKind.LOST,
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT": EndKind.LOST,
}


def status(job: RayJob, handle: Handle, strategy: str, by_evald: bool, logs: Logs) -> Status:
    """What the Jobs API's word on ``job`` and its folder say of the attempt of ``handle``."""
    state = read_json(handle.job_dir / STATE_NAME)
    placement = Placement(
        state=job.status,
        nodes=str(state.get("nodes") or "") if state.get("phase") == "running" else "",
        submitted=job.start_time,
        started=float(state["since"]) if state.get("phase") == "running" and "since" in state else None,
        ended=job.end_time,
    )
    if job.status == "PENDING":
        return Active(Phase.PENDING, f"Ray job pending: {job.message}".rstrip(": "), placement)
    if job.status == "RUNNING":
        if state.get("phase") == "running":
            return Active(Phase.RUNNING, None, placement)
        # Ray says RUNNING from the driver's start: the ranks wait for their bundles still.
        placement = dataclasses.replace(placement, state="PENDING")
        if state.get("phase") != "placing":
            return Active(Phase.PENDING, "its driver is starting", placement)
        waiting = state.get("bundles") or "its placement group"
        scheduling = f"; placement group {state['scheduling']}" if state.get("scheduling") else ""
        reason = f"waiting for resources: {waiting} ({strategy}{scheduling}{_infeasible(state)})"
        return Active(Phase.PENDING, reason, placement)
    return from_folder(handle, f"Ray job {job.submission_id} {job.status}", by_evald, logs, placement, job)


def _infeasible(state: Mapping[str, Any]) -> str:
    """Since when Ray says no node can hold the bundles, and when the job fails for it, if it does."""
    since = _float(state.get("infeasible_since"))
    if since is None:
        return ""
    limit = _float(state.get("infeasible_timeout_s"))
    ends = f", the job fails at {_moment(since + limit)}" if limit is not None else ""
    return f" since {_moment(since)}: no node can hold them{ends}"


def _moment(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_folder(
    handle: Handle,
    said: str,
    by_evald: bool,
    logs: Logs,
    placement: Placement | None = None,
    job: RayJob | None = None,
) -> Ended:
    """How the job ended: the driver's ``exit.json``, else Ray's word, else its result file."""
    record = read_json(handle.job_dir / EXIT_NAME)
    where = _placed(placement or Placement(state="UNKNOWN"), record)
    stopped = job is not None and job.status == "STOPPED"
    if stopped or record.get("end") == "cancelled":
        who = "by evald" if by_evald else "outside evald (ray job stop)"
        return Ended(EndKind.CANCELLED, f"Ray job {handle.external_id} cancelled {who}", placement=where)
    if record.get("end") == "succeeded":
        if result(handle.job_dir) is not None:
            return Ended(EndKind.SUCCEEDED, f"{said}: every rank exited 0", exit_code=0, placement=where)
        return Ended(
            EndKind.FAILED,
            f"{said}, but the worker wrote no result.json",
            exit_code=0,
            log_tail=log_tail(handle.job_dir, None),
            placement=where,
        )
    if record.get("end") in _ENDS:
        code = record.get("exit_code")
        code = int(code) if isinstance(code, int) else None
        kind = _ENDS[str(record["end"])]
        if kind is EndKind.FAILED and code == EXIT_OUT_OF_MEMORY:
            kind = EndKind.OUT_OF_MEMORY
        rank = record.get("rank")
        tail = log_tail(handle.job_dir, rank if isinstance(rank, int) else None)
        return Ended(kind, f"{said}: {record.get('detail')}", exit_code=code, log_tail=tail, placement=where)
    if job is not None and job.error_type in _RAY_ERRORS:
        return Ended(_RAY_ERRORS[job.error_type], f"{said}: {job.message}", placement=where)
    if job is not None:
        # The driver never wrote its end: it could not start (an interpreter without ray, a
        # runtime_env that would not install) — the job log says why.
        tail = stderr_tail_text(logs(job.submission_id))
        return Ended(
            EndKind.FAILED,
            f"{said} before its driver wrote an end ({job.error_type or 'no error type'}): {job.message}",
            exit_code=job.driver_exit_code,
            log_tail=tail,
            placement=where,
        )
    if result(handle.job_dir) is not None:
        return Ended(EndKind.SUCCEEDED, f"{said}; its result was written", exit_code=0, placement=where)
    return Ended(
        EndKind.LOST,
        f"{said}, and {handle.job_dir} holds no {EXIT_NAME}",
        log_tail=stderr_tail(handle.job_dir / DRIVER_LOG),
        placement=where,
    )


def _placed(where: Placement, record: Mapping[str, Any]) -> Placement:
    """``where`` with the nodes and end time the driver's ``exit.json`` (``record``) names, if any."""
    if not record.get("nodes"):
        return where
    return Placement(
        state=where.state,
        nodes=str(record["nodes"]),
        submitted=where.submitted,
        started=where.started,
        ended=where.ended or _float(record.get("ended")),
    )


def log_tail(folder: Path, rank: int | None) -> str:
    """The end of the failed rank's log, else of the job's one-rank log, else of the driver's."""
    if rank is not None and (folder / f"rank-{rank}.log").is_file():
        return f"rank {rank} failed; its log ends: {stderr_tail(folder / f'rank-{rank}.log')}"
    for name in (LOG_NAME, DRIVER_LOG):
        if (folder / name).is_file() and (folder / name).stat().st_size:
            return stderr_tail(folder / name)
    return ""


def stderr_tail_text(text: str, limit: int = 2000) -> str:
    return text.strip()[-limit:]


def read_json(path: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            return data
    return {}


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def result(folder: Path) -> JobResult | None:
    with contextlib.suppress(OSError, ValueError):
        result = JobResult.read(folder / "result.json")
        return result if result.error is None else None
    return None
