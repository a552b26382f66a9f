"""``evald results``: stored metric values, filtered as the HTTP API filters them, as a table, JSON or CSV."""

from __future__ import annotations

import argparse

from daemon import filter_values
from daemon.analysis import report
from daemon.cli.base import database_url, open_current
from daemon.errors import ConfigError, EvaldError
from storage import queries
from storage.queries.filters import unknown_filter


def _bound(option: str, text: str | None) -> int | None:
    try:
        return None if text is None else filter_values.parse_integer(text.strip())
    except filter_values.ValueRefused as exc:
        raise ConfigError(option, [str(exc)]) from None


def _steps(text: str) -> tuple[int | None, int | None]:
    """``--steps A:B``, either side empty for an open end; reversed (``500:100``) is refused saying so."""
    low, colon, high = text.partition(":")
    if not colon:
        raise ConfigError("--steps", [f"{filter_values.shown(text)} is not A:B (e.g. 100:500, 100: or :500)"])
    try:
        step_min = filter_values.parse_integer(low.strip()) if low.strip() else None
        step_max = filter_values.parse_integer(high.strip()) if high.strip() else None
    except filter_values.ValueRefused as exc:
        raise ConfigError("--steps", [f"{filter_values.shown(text)}: {exc}"]) from None
    if step_min is not None and step_max is not None and step_min > step_max:
        said = f"{step_min}:{step_max} is reversed: the lower step comes first"
        raise ConfigError("--steps", [f"{said} (--steps {step_max}:{step_min})"])
    return step_min, step_max


def nothing_stored(run: str) -> str:
    """What ``results`` says of a run it knows (configured, or recorded by a daemon) with no result stored:
    which commands store one, since ``evald eval`` alone does not."""
    return (
        f"run {run!r} has no stored results: the daemon (`evald run`) stores what it evaluates; `evald eval` "
        "without --store stores nothing (add --store to keep its results)"
    )


def step_range(
    steps: str | None, step_min: str | None, step_max: str | None
) -> tuple[int | None, int | None]:
    """``--steps A:B`` (either side may be empty) or ``--step-min``/``--step-max``, inclusive, as the API
    takes them (:mod:`daemon.filter_values`); :class:`ConfigError` (exit 2) naming the option given."""
    low, high = _bound("--step-min", step_min), _bound("--step-max", step_max)
    if steps is not None:
        if low is not None or high is not None:
            raise ConfigError("--steps", ["give --steps A:B or --step-min/--step-max, not both"])
        return _steps(steps)
    if low is not None and high is not None and low > high:
        raise ConfigError(
            "--step-min",
            [f"{low} is above --step-max {high}: the range is reversed (--step-min {high} --step-max {low})"],
        )
    return low, high


def _configured(args: argparse.Namespace, run: str) -> bool:
    """Whether the config file names ``run`` under ``[[runs]]``: read from the file's document on the error
    path alone, so that ``results`` still answers without validating any section."""
    from daemon.config.document import config_path, read_document

    runs = read_document(config_path(args.config)).get("runs")
    return isinstance(runs, list) and any(isinstance(r, dict) and r.get("name") == run for r in runs)


def cmd_results(args: argparse.Namespace) -> int:
    step_min, step_max = step_range(args.steps, args.step_min, args.step_max)
    database = open_current(database_url(args))
    try:
        # A core connection: the statements here need no ORM (storage.tables), and its import and the
        # models' mapping were a third of this command's time.
        with database.connection() as session:
            if args.run is not None and not queries.run_exists(session, args.run):
                if _configured(args, args.run):
                    raise EvaldError(nothing_stored(args.run))
                known = ", ".join(queries.run_names(session)) or "none"
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
