"""``evald history``: every worker run of one job (retries, OOM, errors) and where it stands now."""

from __future__ import annotations

import argparse

from daemon.analysis.report.job_history import history
from daemon.cli.base import database_url, open_current, terminal_width
from daemon.errors import EvaldError
from storage import queries
from storage.queries.retry import job_submission


def cmd_history(args: argparse.Namespace) -> int:
    database = open_current(database_url(args))
    try:
        with database.session() as session:
            attempts = queries.job_history(session, args.job)
            current = job_submission(session, args.job)
    finally:
        database.dispose()
    if current is None:
        raise EvaldError(f"no job {args.job} (see `evald status` for job ids)")
    print(history(attempts, args.format, current, terminal_width()))
    return 0
