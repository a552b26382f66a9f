"""The jobs of daemons that died: requeued, adopted when their result is already written, or failed.

A claim whose lease ran out is an orphan. Its Slurm job may still be queued or running (re-attached), its
worker may have written its result into this daemon's state folder (adopted: nothing is evaluated twice),
else it is requeued, or failed once its ``max_attempts`` are spent: a job that kills its daemon would
otherwise take every daemon down in turn, forever. The dead daemon's worker run gets its history row
(``lost``), written here.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog
from sqlalchemy.orm import Session

from daemon.analysis.repeats import RepeatedErrors
from daemon.config import Config
from daemon.running import workers
from daemon.running.runner import JobRunner
from inference.spec import JobSpec
from storage import queries
from storage.database import Database
from storage.errors import DatabaseUnreachable
from storage.models import utcnow
from storage.queries import Orphan, attempt_recorded, fail_orphan

log = structlog.get_logger("evald.service")

#: An orphan adopted: its claim taken over, with the spec and outcome its worker left.
Adopted = tuple[queries.ClaimedJob, JobSpec, workers.Outcome]


def recover(
    database: Database, config: Config, runner: JobRunner, owner: str, errors: RepeatedErrors
) -> None:
    """Requeue, adopt or fail the orphans of daemons that died (see the module's docstring)."""
    lease = timedelta(seconds=config.scheduling.lease_secs)
    max_attempts = config.inference.max_attempts
    adopted: list[Adopted] = []
    requeued: list[int] = []
    failed: list[Orphan] = []
    with database.session() as session:
        found = queries.orphans(session, lease=lease, every_running=database.is_sqlite, keep=runner.own_jobs)
        for orphan in found:
            try:
                # One orphan the database refuses (its savepoint undone) leaves the others recovered.
                with session.begin_nested():
                    # A claim whose Slurm job is still queued or running: re-attached, not redone.
                    if runner.reattach(session, orphan):
                        continue
                    settled = _settle_orphan(session, orphan, config, owner)
            except DatabaseUnreachable:
                raise
            except Exception as exc:
                errors.failed("job.not_recovered", exc, job_id=orphan.id)
                continue
            if isinstance(settled, tuple):
                adopted.append(settled)
            elif settled:
                failed.append(orphan)
            else:
                requeued.append(orphan.id)
        queries.requeue_orphans(session, requeued)
    if requeued:
        log.warning("job.recovered", job_ids=requeued, reason="its daemon stopped while it ran")
    for orphan in failed:
        log.error(
            "job.failed",
            job_id=orphan.id,
            task=orphan.task,
            attempt=orphan.attempts,
            kind="lost",
            error=f"its daemon stopped while it ran, and its {max_attempts} attempt(s) are spent",
        )
    for job, spec, outcome in adopted:
        runner.adopt(job, spec, outcome)


def _settle_orphan(session: Session, orphan: Orphan, config: Config, owner: str) -> Adopted | bool:
    """Adopt the orphan whose worker finished (its claim, spec and outcome), or record its lost
    attempt and fail it when its attempts are spent (True) or leave it to be requeued (False)."""
    max_attempts = config.inference.max_attempts
    finished = workers.finished_result(config.daemon.state_dir, orphan.id, orphan.attempts)
    if finished is not None:
        return (queries.take_over(session, orphan.id, owner), *finished)
    spent = orphan.attempts >= max_attempts
    error = f"its daemon ({orphan.claimed_by or 'unknown'}) stopped while it ran; " + (
        f"failed by {owner}: attempt {orphan.attempts} of {max_attempts}" if spent else f"requeued by {owner}"
    )
    if orphan.attempts > 0 and not attempt_recorded(session, orphan.id, orphan.attempts, orphan.started_at):
        spec = workers.attempt_spec(config.daemon.state_dir, orphan.id, orphan.attempts)
        queries.record_attempt(session, lost_attempt(orphan, error, spec, config, utcnow()))
    if spent:
        fail_orphan(session, orphan.id, kind="lost", error=error)
    return spent


def lost_attempt(
    orphan: Orphan, error: str, spec: JobSpec | None, config: Config, now: datetime
) -> queries.AttemptRow:
    """The history row of a worker run whose daemon died: as its ``spec`` in the state folder says where
    this daemon can read it (the same host), else as this daemon's config would have run it."""
    inference = spec.inference if spec is not None else config.inference.spec()
    task = config.task(orphan.task)
    batch_size = spec.task.batch_size if spec is not None else task.batch_size if task is not None else 0
    started = orphan.started_at or now
    # Its daemon's last sign of life is as near to when the worker stopped as anyone knows.
    ended = max(started, min(orphan.heartbeat_at or now, now))
    return queries.AttemptRow(
        job_id=orphan.id,
        attempt=orphan.attempts,
        engine=inference.engine,
        tp=inference.tp,
        dp=inference.dp,
        batch_size=batch_size,
        outcome="lost",
        error_kind="daemon_lost",
        error=error,
        started_at=started,
        finished_at=ended,
        duration_s=(ended - started).total_seconds(),
    )
