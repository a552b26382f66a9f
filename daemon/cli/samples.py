"""``evald samples``: one job's per-sample outputs, and the inputs it left out of its metrics."""

from __future__ import annotations

import argparse
import shutil

from daemon.analysis import report
from daemon.cli.base import database_url, open_current
from storage import queries


def cmd_samples(args: argparse.Namespace) -> int:
    database = open_current(database_url(args))
    try:
        with database.session() as session:
            found = queries.job_samples(
                session,
                run=args.run,
                step=args.step,
                task=args.task,
                stage=args.stage,
                wrong_only=args.wrong_only,
            )
    finally:
        database.dispose()
    if args.format == "json":
        print(report.samples_json(found, wrong_only=args.wrong_only))
    else:
        width = shutil.get_terminal_size().columns
        print(report.samples_text(found, width=width, wrong_only=args.wrong_only))
    return 0
