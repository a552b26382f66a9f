"""``evald export``: a run's stored results written in another tool's format (TensorBoard, lm-eval) or
sent to a tracker (MLflow, W&B)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

from daemon.analysis import curves
from daemon.analysis.run_rows import run_results
from daemon.cli.base import load, open_current
from daemon.errors import ConfigError, EvaldError
from storage import alerting, queries


def cmd_export_tensorboard(args: argparse.Namespace) -> int:
    from daemon.export.tensorboard import write_events

    config = load(args)
    database = open_current(config.database.url)
    try:
        with database.session() as session:
            rows = run_results(session, args.run)
            alerts = alerting.alert_rows(session, run=args.run)
            jobs = sorted({(r.step, r.task, r.stage) for r in rows if r.step is not None})

            def job_samples() -> Iterator[queries.JobSamples]:
                # One job at a time, rendered and dropped before the next is read (a run's samples
                # together could be gigabytes).
                for step, task, stage in jobs:
                    try:
                        found = queries.job_samples(session, run=args.run, step=step, task=task, stage=stage)
                    except queries.SamplesUnavailable:
                        continue
                    if found.samples or found.problems:
                        yield found

            try:
                exported = write_events(
                    curves.curves(rows),
                    run=args.run,
                    out=Path(args.out),
                    replace=args.replace,
                    samples=job_samples(),
                    alerts=alerts,
                )
            except OSError as exc:
                raise EvaldError(f"{args.out}: cannot write event files: {exc.strerror or exc}") from exc
    finally:
        database.dispose()
    print(
        f"{exported.folder}: {exported.tags} scalar tag(s), {exported.points} point(s), "
        f"{exported.bands} stderr margin chart(s), {exported.sample_texts} sample text(s), "
        f"{exported.alert_texts} alert text(s) in {len(exported.files)} event file(s); "
        f"view with: tensorboard --logdir {args.out}"
    )
    return 0


def cmd_export_tracker(args: argparse.Namespace) -> int:
    """``evald export mlflow|wandb|tensorboard --run R``: the run's stored results sent to a tracker."""
    from daemon.delivery.backfill import backfill, pick_tracker

    config = load(args)
    try:
        tracker = pick_tracker(config, args.export_command, args.tracker)
    except EvaldError as exc:
        # No such tracker, or several without --tracker: the command line asks what the config lacks.
        raise ConfigError(f"export {args.export_command}", [str(exc)]) from exc
    database = open_current(config.database.url)
    try:
        done = backfill(database, tracker, run=args.run, environ=os.environ)
    finally:
        database.dispose()
    print(
        f"{done.tracker}: {done.evaluations} evaluation(s) and {done.alerts} alert(s) of {args.run}: "
        f"{done.queued} queued, "
        f"{done.sent} sent, {done.already} already there, {done.pending} still pending; {done.where}"
    )
    return 0 if done.pending == 0 else 1


def cmd_export_lm_eval(args: argparse.Namespace) -> int:
    from daemon.export.lm_eval import Checkpoint, ExportError, lm_eval_results, write
    from storage.queries.exports import evaluated_checkpoints

    config = load(args)
    database = open_current(config.database.url)
    try:
        with database.session() as session:
            rows = run_results(session, args.run)
            at_step = [r for r in rows if r.step == args.step]
            found = evaluated_checkpoints(
                session, run=args.run, step=args.step, tasks={r.task for r in at_step}
            )
    finally:
        database.dispose()
    # The checkpoint the chosen rows came from (two folders at one step: the one evaluated last).
    newest = max(at_step, key=lambda r: r.evaluated_at).checkpoint if at_step else None
    evaluated = next((c for c in found if c.name == newest), None)
    try:
        if evaluated is None:
            raise LookupError(f"run {args.run!r} has no stored result at step {args.step}")
        checkpoint = Checkpoint(evaluated.path, evaluated.duration_s)
        document = lm_eval_results(
            [r for r in rows if r.checkpoint == evaluated.name],
            config,
            run=args.run,
            step=args.step,
            checkpoint=checkpoint,
        )
    except ExportError as exc:
        raise EvaldError(str(exc)) from exc
    except LookupError as exc:
        steps = ", ".join(str(s) for s in sorted({r.step for r in rows if r.step is not None}))
        raise EvaldError(f"{exc.args[0]} (steps with results: {steps or 'none'})") from exc
    out = Path(args.out) if args.out else None
    try:
        text = write(document, out)
    except OSError as exc:
        raise EvaldError(f"{args.out}: cannot write: {exc.strerror or exc}") from exc
    if out is None:
        print(text)
    else:
        print(f"{out}: {len(document['results'])} task(s) of run {args.run!r} at step {args.step}")
    return 0
