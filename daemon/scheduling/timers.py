"""The daemon's clockwork: APScheduler 3.x interval jobs that wake the main loop.

Each job only raises a flag; the work it stands for (rescan, time trigger, deferral re-check,
housekeeping) runs on the main thread, which owns the database session and the workers. The job store
is in memory and rebuilt from config at every start: the schedule's state lives in evald's own tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime

import structlog
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler

log = structlog.get_logger("evald.timers")


class Timers:
    def __init__(self) -> None:
        # coalesce: a backlog of missed firings (the machine slept) runs once; max_instances: never two
        # of one job at once. A late firing is still worth running, whatever its delay.
        self._scheduler = BackgroundScheduler(
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None}
        )
        self._scheduler.add_listener(self._on_problem, EVENT_JOB_ERROR | EVENT_JOB_MISSED)

    @staticmethod
    def _on_problem(event: JobExecutionEvent) -> None:
        # Job ids are their names; one job's failure never stops the others.
        if event.code == EVENT_JOB_MISSED:
            log.warning("scheduler.job_missed", job=event.job_id, scheduled=str(event.scheduled_run_time))
        else:
            log.error("scheduler.job_failed", job=event.job_id, error=repr(event.exception))

    def every(
        self, name: str, seconds: float, action: Callable[[], None], *, first: datetime | None = None
    ) -> None:
        """Run ``action`` every ``seconds`` (from ``first`` when given), replacing a job of that name."""
        # Before the scheduler starts, add_job queues without replacing: drop a queued one by hand.
        with contextlib.suppress(JobLookupError):
            self._scheduler.remove_job(name)
        self._scheduler.add_job(
            action,
            "interval",
            seconds=seconds,
            start_date=first,
            id=name,
            name=name,
            replace_existing=True,
        )

    def clear(self) -> None:
        """Drop every job (a reload arms them again from the new config)."""
        self._scheduler.remove_all_jobs()

    def names(self) -> list[str]:
        return sorted(job.id for job in self._scheduler.get_jobs())

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
