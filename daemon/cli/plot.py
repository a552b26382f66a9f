"""``evald plot``: a metric's curves drawn to a PNG, PDF or SVG, with error bands, alerts and the best
checkpoint marked."""

from __future__ import annotations

import argparse
from pathlib import Path

from daemon.alerts.lifecycle import Alerter
from daemon.analysis import curves
from daemon.analysis.plot import PlotFormatError, plot_format, render
from daemon.analysis.run_rows import run_results
from daemon.cli.base import load, open_current
from daemon.errors import ConfigError, EvaldError
from storage import alerting


def cmd_plot(args: argparse.Namespace) -> int:
    runs = list(dict.fromkeys(args.run))
    out = Path(args.out)
    try:
        plot_format(out)
    except PlotFormatError as exc:
        raise ConfigError("--out", [str(exc)]) from exc
    config = load(args)
    database = open_current(config.database.url)
    try:
        with database.session() as session:
            rows = [
                row
                for run in runs
                for row in run_results(session, run, task=args.task, stage=args.stage, metric=args.metric)
            ]
            alerts = [alert for run in runs for alert in alerting.alert_rows(session, run=run)]
    finally:
        database.dispose()
    try:
        plotted = render(
            curves.curves(rows),
            alerts,
            out=out,
            direction=Alerter(config).direction,
            smoothing=args.smooth,
            title=args.title,
        )
    except OSError as exc:
        raise EvaldError(f"{out}: cannot write the plot: {exc.strerror or exc}") from exc
    best = "; ".join(f"best {label}: step {step} ({value:.4g})" for label, step, value in plotted.best)
    print(
        f"{out}: {plotted.curves} curve(s), {plotted.points} point(s), {plotted.alerts} alert marker(s)"
        + (f"; {best}" if best else "")
    )
    return 0
