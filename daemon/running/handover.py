"""Handing a job to an executor and taking one back: the job's folder, its name for the executor, the
plan its earlier attempts make for it, and re-attaching to a dead daemon's submission that still runs.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.config import Config
from daemon.running import remote, retries
from daemon.running.attempt import Attempt, Stage
from daemon.running.executor_watch import ExecutorWatch
from daemon.running.executors.base import Ended, Executor, ExecutorUnavailable, Handle, JobRef
from daemon.running.executors.local import LOG_NAME
from daemon.running.workers import Outcome, read_outcome
from inference.spec import JobSpec
from storage import queries
from storage.models import utcnow

log = structlog.get_logger("evald.runner")


def read_end(spec: JobSpec, ended: Ended, *, detached: bool) -> Outcome:
    """The runner's outcome of an attempt its executor says ended, from the job's files."""
    if detached:
        return remote.outcome_of(ended, spec)
    if ended.exit_code is None:
        return Outcome(error_kind="lost", error=ended.detail)
    return read_outcome(spec, ended.exit_code, spec.result_path.parent / LOG_NAME)


def write_folder(spec: JobSpec) -> Path:
    """The job's folder with its ``spec.json`` (and nothing an earlier worker left); the spec's path."""
    job_dir = spec.result_path.parent
    job_dir.mkdir(parents=True, exist_ok=True)
    # A job given back at shutdown reuses its folder: nothing an earlier worker left may be read as
    # this one's.
    for stale in (*job_dir.glob("result*.json"), *job_dir.glob("rank-*.log")):
        stale.unlink(missing_ok=True)
    spec_path = job_dir / "spec.json"
    spec_path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
    return spec_path


def ref(attempt: Attempt) -> JobRef:
    job = attempt.job
    return JobRef(job.id, job.attempts, job.run, job.task)


def epoch(moment: datetime) -> float:
    """Seconds since the epoch of a stored time (naive on SQLite: UTC)."""
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def retry_plan(session: Session, job_id: int, executor: Executor) -> retries.RetryPlan | None:
    """The plan of the job's attempt from its history, for an executor with time limits of its own."""
    limits = executor.time_limits()
    if limits is None:
        return None
    history = queries.job_history(session, job_id)
    return retries.plan(history, time_limit_s=limits[0], max_time_limit_s=limits[1])


def reattach(
    session: Session,
    orphan: queries.Orphan,
    config: Config,
    *,
    watch: ExecutorWatch,
    owner: str,
    running: dict[int, Attempt],
) -> bool:
    """Take over an orphan (a dead daemon's claim, locked by :func:`queries.orphans`) whose Slurm job
    is still known: by the handle stored on it, else found by name and comment; True when taken (it
    is polled from now on and nothing is submitted again), False to recover it as usual. With the
    controller away and a job folder for the claim, the claim is taken and its submission looked
    for once the controller answers."""
    executor = watch.executor
    if not executor.detached:
        return False
    job_ref = JobRef(orphan.id, orphan.attempts)
    handle = stored_handle(orphan, executor.kind)
    recorded = handle is not None
    handle, how = (handle, "recorded") if recorded else _found(orphan, job_ref, watch)
    folder = handle.job_dir if handle is not None else executor.job_folder(job_ref)
    try:
        spec = JobSpec.model_validate_json((folder / "spec.json").read_bytes())
    except (OSError, ValueError):
        if handle is not None:
            # Without its spec nobody can store what it returns: it would only hold the cluster.
            with contextlib.suppress(ExecutorUnavailable):
                executor.cancel(handle)
        return False
    if handle is None and how != "to be found":
        return False
    job = queries.take_over(session, orphan.id, owner)
    if handle is not None and not recorded:
        queries.record_handle(
            session, job_id=job.id, owner=owner, attempt=job.attempts, handle=handle.to_json()
        )
    attempt = Attempt(
        job,
        spec,
        config,
        executor,
        stage=Stage.STARTED,
        started_at=orphan.started_at or utcnow(),
        handle=handle,
        handle_recorded=handle is not None,
        plan=retry_plan(session, job.id, executor),
        taken_over=orphan.claimed_by,
    )
    running[job.id] = attempt
    log.info(
        "job.reattached",
        job_id=job.id,
        run=job.run,
        attempt=job.attempts,
        **(handle.logged() if handle is not None else {}),
        how=how,
        was=orphan.claimed_by,
    )
    return True


def _found(orphan: queries.Orphan, job_ref: JobRef, watch: ExecutorWatch) -> tuple[Handle | None, str]:
    """The orphan's submission looked for by name (no handle was stored), and how: ``found by name``, or
    ``to be found`` while the controller is away (it is looked for once it answers)."""
    since = epoch(orphan.started_at) if orphan.started_at is not None else None
    try:
        return watch.executor.find(job_ref, since=since), "found by name"
    except ExecutorUnavailable as exc:
        watch.away(str(exc))
        return None, "to be found"


def stored_handle(orphan: queries.Orphan, kind: str) -> Handle | None:
    """The handle stored on an orphan's claim, if it is this claim's and this executor's."""
    if not orphan.executor_handle:
        return None
    try:
        handle = Handle.from_json(orphan.executor_handle)
    except (ValueError, KeyError, TypeError):
        return None
    if handle.executor != kind or handle.attempt != orphan.attempts or handle.job_id != orphan.id:
        return None
    return handle


def say_submitted(attempt: Attempt, handle: Handle, how: str) -> None:
    """``job.submitted`` for a job's first attempt, ``job.resubmitted`` for a later one (after a ``lost``,
    ``node_fail`` or ``timeout`` end), with the scheduler's job under its executor's key."""
    job = attempt.job
    event = "job.resubmitted" if job.attempts > 1 else "job.submitted"
    log.info(
        event,
        job_id=job.id,
        run=job.run,
        step=job.step,
        task=job.task,
        attempt=job.attempts,
        **handle.logged(),
        job_dir=str(handle.job_dir),
        how=how,
    )
