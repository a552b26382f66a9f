"""``evald results``: stored metric values, filtered as the HTTP API filters them, as a table, JSON or CSV."""

from __future__ import annotations

import argparse

from daemon import filter_values
from daemon.analysis import report
from daemon.cli.base import load, open_current
from daemon.errors import ConfigError, EvaldError
from storage import queries
from storage.queries.filters import unknown_filter


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


def nothing_stored(run: str) -> str:
    """What ``results`` says of a run it knows (configured, or recorded by a daemon) with no result stored:
    which commands store one, since ``evald eval`` alone does not."""
    return (
        f"run {run!r} has no stored results: the daemon (`evald run`) stores what it evaluates; `evald eval` "
        "without --store stores nothing (add --store to keep its results)"
    )


def cmd_results(args: argparse.Namespace) -> int:
    step_min, step_max = _step_range(args)
    config = load(args)
    database = open_current(config)
    try:
        with database.session() as session:
            if args.run is not None and not queries.run_exists(session, args.run):
                if config.run(args.run) is not None:
                    raise EvaldError(nothing_stored(args.run))
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
            if not rows and args.run is not None and not queries.run_has_results(session, args.run):
                raise EvaldError(nothing_stored(args.run))
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
