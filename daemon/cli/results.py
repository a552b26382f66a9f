"""The commands that read what was stored: ``evald results``, ``history``, ``samples``, ``alerts``,
``compare`` and ``plot``."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from daemon import filter_values
from daemon.analysis import curves, report
from daemon.analysis.compare import compare_runs
from daemon.analysis.run_rows import run_results
from daemon.analysis.smoothing import parse_smoothing
from daemon.cli.base import load, open_current
from daemon.errors import ConfigError, EvaldError
from storage import alerting, queries


def _bound(option: str, text: str | None) -> int | None:
    try:
        return None if text is None else filter_values.parse_integer(text.strip())
    except filter_values.ValueRefused as exc:
        raise ConfigError(option, [str(exc)]) from None


def _step_range(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``--steps A:B`` (either side may be empty) or ``--step-min``/``--step-max``, inclusive; each bound
    and the lower above the upper are refused as the API refuses them (:mod:`daemon.filter_values`)."""
    step_min, step_max = _bound("--step-min", args.step_min), _bound("--step-max", args.step_max)
    if args.steps is not None:
        if step_min is not None or step_max is not None:
            raise ConfigError("--steps", ["give --steps A:B or --step-min/--step-max, not both"])
        low, colon, high = args.steps.partition(":")
        if not colon:
            shape = f"{filter_values.shown(args.steps)} is not A:B (e.g. 100:500, 100: or :500)"
            raise ConfigError("--steps", [shape])
        try:
            step_min = filter_values.parse_integer(low.strip()) if low.strip() else None
            step_max = filter_values.parse_integer(high.strip()) if high.strip() else None
        except filter_values.ValueRefused as exc:
            raise ConfigError("--steps", [f"{filter_values.shown(args.steps)}: {exc}"]) from None
    problem = filter_values.step_range_problem(step_min, step_max)
    if problem is not None:
        raise ConfigError("--step-min", [problem])
    return step_min, step_max


def cmd_results(args: argparse.Namespace) -> int:
    from storage.queries.filters import unknown_filter

    step_min, step_max = _step_range(args)
    config = load(args)
    database = open_current(config)
    try:
        with database.session() as session:
            if args.run is not None and not queries.run_exists(session, args.run):
                known = ", ".join(r.name for r in queries.run_rows(session)) or "none"
                raise EvaldError(f"no run {args.run!r} (runs: {known})")
            task, stage, metric = args.task, args.stage, args.metric
            rows = queries.result_rows(
                session,
                run=args.run,
                task=task,
                stage=stage,
                metric=metric,
                step_min=step_min,
                step_max=step_max,
            )
            # An empty answer: a filter that names nothing stored is an error listing what is (a range
            # past the newest step is just empty).
            unknown = (
                None if rows else unknown_filter(session, run=args.run, task=task, stage=stage, metric=metric)
            )
    finally:
        database.dispose()
    if unknown is not None:
        raise EvaldError(unknown.message())
    print(report.results(rows, args.format))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    from daemon.analysis.report.job_history import history
    from storage.queries.retry import job_submission

    config = load(args)
    database = open_current(config)
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


def terminal_width() -> int | None:
    """The terminal's columns, errors being cut to fit them (``status``, ``history``); None when the
    output is not a terminal (a file, a pipe: errors keep a fixed length of their first line)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def cmd_samples(args: argparse.Namespace) -> int:
    config = load(args)
    database = open_current(config)
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


def cmd_alerts(args: argparse.Namespace) -> int:
    config = load(args)
    database = open_current(config)
    try:
        with database.session() as session:
            rows = alerting.alert_rows(session, run=args.run, state=args.state)
    finally:
        database.dispose()
    if args.format == "json":
        print(json.dumps([report.alert_json(row) for row in rows], indent=1, default=str))
    else:
        print(report.alerts_text(rows))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.run) != 2:
        raise ConfigError("--run", [f"give exactly two runs (--run A --run B), got {len(args.run)}"])
    if not (0 < args.fdr < 1):
        raise ConfigError(
            "--fdr", [f"must be a false discovery rate between 0 and 1 (e.g. 0.05), got {args.fdr}"]
        )
    smoothing = parse_smoothing(args.smooth)
    run_a, run_b = args.run
    config = load(args)
    database = open_current(config)
    try:
        found = compare_runs(
            database,
            run_a,
            run_b,
            task=args.task,
            stage=args.stage,
            metric=args.metric,
            smoothing=smoothing,
            fdr=args.fdr,
        )
    finally:
        database.dispose()
    print(report.comparison(found, args.format))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from daemon.alerts.lifecycle import Alerter
    from daemon.analysis.plot import PlotFormatError, plot_format, render  # matplotlib is slow to import

    smoothing = parse_smoothing(args.smooth)
    runs = list(dict.fromkeys(args.run))
    out = Path(args.out)
    try:
        plot_format(out)
    except PlotFormatError as exc:
        raise ConfigError("--out", [str(exc)]) from exc
    config = load(args)
    database = open_current(config)
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
            smoothing=smoothing,
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
