"""Leases and fencing: each claim's heartbeat, and what a claim that was lost becomes.

A running job's lease is its heartbeat (every ``heartbeat_secs``), written only under the claim that
holds the job (its attempt number: the fencing token). A beat that finds the claim gone means the lease
ran out and another claim holds the job: its worker is stopped and nothing it returns is stored. A job in
Slurm whose claim another daemon took over by re-attaching to the same submission is left to it
(``job.handed_over``); any other submission of a lost claim is cancelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

import structlog

from daemon.config import Config
from daemon.running.attempt import Attempt
from daemon.running.executors.base import ExecutorUnavailable
from storage import queries
from storage.database import Database
from storage.errors import DatabaseUnreachable

log = structlog.get_logger("evald.runner")


class Leased(Protocol):
    """What holds a claim: a worker run (:class:`Attempt`), or a download before one (``fetches.Fetch``)."""

    job: queries.ClaimedJob
    config: Config
    last_heartbeat: float


HeldT = TypeVar("HeldT", bound=Leased)


def renew(
    database: Database,
    owner: str,
    attempts: Iterable[HeldT],
    now: float,
    *,
    lost: Callable[[HeldT], None],
    refused: Callable[[HeldT, Exception], None],
) -> None:
    """Beat every lease that is due. ``lost``: the claim is no longer this daemon's. ``refused``: the
    database refuses this job's row (a constraint, a trigger); the others' leases stay fresh. A beat that
    cannot reach the database ends the pass and is tried again in the next one: the daemon's loop spaces
    those out while the database is away."""
    for attempt in list(attempts):
        if now - attempt.last_heartbeat < attempt.config.scheduling.heartbeat_secs:
            continue
        try:
            with database.session() as session:
                held = queries.heartbeat(session, attempt.job.id, owner, attempt.job.attempts)
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            refused(attempt, exc)
            continue
        attempt.last_heartbeat = now
        if not held:
            lost(attempt)


def handed_over(database: Database, attempt: Attempt) -> bool:
    """The lease of a job in Slurm ran out: True when the daemon that took the claim re-attached to the
    same submission (it records the attempt now; nothing is cancelled), else the submission is cancelled
    (a new claim submits its own) and False."""
    handle = attempt.handle
    with database.session() as session:
        stored = queries.job_handle(session, attempt.job.id)
    if handle is not None and stored == (attempt.job.attempts, handle.to_json()):
        log.warning(
            "job.handed_over",
            job_id=attempt.job.id,
            attempt=attempt.job.attempts,
            **handle.logged(),
            reason="its lease ran out and another daemon re-attached to its scheduler's job",
        )
        return True
    cancel(attempt)
    return False


def cancel(attempt: Attempt) -> None:
    """Cancel a job in the scheduler on purpose (never as a side effect: it outlives its daemon, and the
    next one re-attaches to it); a controller away is logged and the job left."""
    if attempt.executor is None or attempt.handle is None:
        return
    try:
        attempt.executor.cancel(attempt.handle)
    except ExecutorUnavailable as exc:
        log.error(
            "job.not_cancelled",
            job_id=attempt.job.id,
            **attempt.handle.logged(),
            error=str(exc),
        )
