"""``evald compare``: two runs at matched steps, the difference at each tested (paired where prompts are
shared) with the false discovery rate held over every point."""

from __future__ import annotations

import argparse

from daemon.analysis import report
from daemon.analysis.compare import compare_runs
from daemon.cli.base import database_url, open_current
from daemon.errors import ConfigError


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.run) != 2:
        raise ConfigError("--run", [f"give exactly two runs (--run A --run B), got {len(args.run)}"])
    if not (0 < args.fdr < 1):
        raise ConfigError(
            "--fdr", [f"must be a false discovery rate between 0 and 1 (e.g. 0.05), got {args.fdr}"]
        )
    run_a, run_b = args.run
    database = open_current(database_url(args))
    try:
        found = compare_runs(
            database,
            run_a,
            run_b,
            task=args.task,
            stage=args.stage,
            metric=args.metric,
            smoothing=args.smooth,
            fdr=args.fdr,
        )
    finally:
        database.dispose()
    print(report.comparison(found, args.format))
    return 0
