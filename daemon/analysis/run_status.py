"""Every configured run's status read from the database, as ``evald status`` shows it.

What is stored (checkpoints, jobs, plans, schedules, ignored and alternate folders, the newest results)
is assembled by :func:`daemon.analysis.report.status`, with the scheduler's view of jobs handed to Slurm.
"""

from __future__ import annotations

from typing import Any

from daemon.analysis import report
from daemon.config import Config
from daemon.scheduling.policy import schedule_summary
from storage import queries, scheduling
from storage.database import Database
from storage.queries import executor_states


def read_status(database: Database, config: Config) -> dict[str, Any]:
    """Per configured run: ``report.status``'s summary, running jobs with their Slurm job id and state."""
    with database.session() as session:
        checkpoints = queries.checkpoint_rows(session)
        jobs = queries.job_rows(session)
        plans = scheduling.plan_rows(session)
        stored = scheduling.schedules(session)
        ignored = queries.ignored_rows(session)
        alternates = queries.alternate_rows(session)
        scheduled = executor_states(session)
        latest = queries.latest_results(session)
    schedules = {
        run.name: schedule_summary(config.scheduling, run, stored[run.name])
        for run in config.runs
        if run.name in stored
    }
    names = [r.name for r in config.runs]
    runs = report.status(
        checkpoints, jobs, names, plans, schedules, config.inference.max_attempts, ignored, alternates, latest
    )
    if scheduled:
        runs = report.with_scheduler(runs, scheduled)
    return runs
