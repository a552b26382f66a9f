"""The ``evald`` command line: thin handlers over config, storage and the service."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from daemon import curves, filter_values, report
from daemon import log as logs
from daemon.config import Config, InferenceConfig, config_path, load_config
from daemon.errors import ConfigError, EvaldError
from daemon.running import remote
from daemon.running.executors.base import ExecutorError, ExecutorUnavailable
from daemon.running.executors.slurm_cli import SlurmError
from daemon.scheduling import stages
from daemon.scheduling.planner import schedule_summary
from daemon.service import resource_probe
from daemon.smoothing import parse_smoothing
from inference import layouts
from inference.dataset import read_dataset
from inference.errors import DatasetInvalid, InferenceError
from inference.launcher import worker_command
from inference.spec import InferenceSpec, JobResult, JobSpec, Problem
from inference.task import stratify_fields
from storage import alerting, migrations, queries, scheduling
from storage.database import Database, describe_url, is_outage
from storage.errors import DatabaseUnreachable, StatementFailed, StorageError
from storage.queries import grades
from storage.queries.jobs import executor_states

EXIT_FAILURE = 1
EXIT_USAGE = 2
#: What a shell reports for a program killed by SIGPIPE (128 + 13), as `head` expects of a writer.
EXIT_BROKEN_PIPE = 141


def _load(args: argparse.Namespace) -> Config:
    return load_config(config_path(args.config))


def dataset_problems(config: Config) -> list[Problem]:
    """Read every task's dataset once: a dataset with no usable row stops the start (it would fail every
    job) as :class:`DatasetInvalid`; the bad rows of a usable one are returned (each job reports them too)."""
    problems: list[Problem] = []
    for task in config.tasks:
        if task.dataset is None:
            # An lm_eval task: lm-eval reads its data, and reports a bad file as the job's error.
            continue
        likelihood = task.kind == "likelihood"
        two_stage = config.scheduling.two_stage.get(task.name)
        spec = task.spec(None if two_stage is None else two_stage.subset())
        dataset = read_dataset(
            task.dataset,
            prompt_field=task.text_field if likelihood else task.prompt_field,
            answer_field=None if likelihood else task.answer_field,
            id_field=task.id_field,
            limit=task.limit,
            stratify_fields=stratify_fields(spec),
        )
        problems.extend(dataset.problems)
    return problems


def check_datasets(config: Config) -> None:
    """Every row of every dataset must be good (``evald config check``)."""
    problems = dataset_problems(config)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more bad rows)" if len(problems) > 1 else ""
        raise DatasetInvalid(f"{first.where}: {first.message}{more}")


def _open_current(config: Config) -> Database:
    database = Database(config.database.url)
    migrations.require_current(database)
    return database


def cmd_run(args: argparse.Namespace) -> int:
    from daemon.service import Service, open_database

    config = _load(args)
    problems = dataset_problems(config)
    logs.configure(sys.stdout, fmt=config.daemon.log_format, level=config.daemon.log_level)
    if problems:
        # Not fatal: each job leaves these rows out and reports them.
        structlog.get_logger("daemon.cli").warning(
            "dataset.problems", count=len(problems), first=[f"{p.where}: {p.message}" for p in problems[:5]]
        )
    database = open_database(config)
    path = config_path(args.config)

    def reload_config() -> Config:
        # The same checks as a start: the file, every field, and a dataset with no usable row. Each
        # problem names the file: config.reload_refused has nothing else to say which one it read.
        where = path.absolute()
        try:
            fresh = load_config(path)
        except ConfigError as exc:
            if not path.exists():
                raise ConfigError(
                    str(where),
                    [f"{where}: file not found (the daemon started with it: put it back and reload)"],
                ) from exc
            raise ConfigError(str(where), [f"{where}: {problem}" for problem in exc.problems]) from exc
        dataset_problems(fresh)
        return fresh

    service = Service(config, database, reload_config=reload_config)
    signal.signal(signal.SIGTERM, service.request_stop)
    signal.signal(signal.SIGINT, service.request_stop)
    signal.signal(signal.SIGHUP, service.request_reload)
    try:
        service.run()
    finally:
        database.dispose()
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    config = _load(args)
    database = Database(config.database.url)
    try:
        before, after = migrations.upgrade(database)
    finally:
        database.dispose()
    where = describe_url(config.database.url)
    if before == after:
        print(f"{where}: already at revision {after}")
    else:
        print(f"{where}: upgraded from {before or 'empty'} to revision {after}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    config = load_config(Path(args.file))
    check_datasets(config)
    database = describe_url(config.database.url)
    print(f"{args.file}: ok ({len(config.runs)} runs, {len(config.tasks)} tasks, database {database})")
    from daemon.web.exposure import open_problem

    exposed = open_problem(config.web, config.web.host)
    if exposed is not None:
        allowed = " (allowed by [web] allow_open = true)" if config.web.allow_open else ""
        print(f"evald: warning: web.host: {exposed}{allowed}", file=sys.stderr)
    for i, webhook in enumerate(config.webhooks):
        # Not an error: the daemon's unit may be what provides it (Environment=, LoadCredential=).
        absent = webhook.secret_absent(os.environ)
        if absent is not None:
            print(
                f"evald: warning: webhooks[{i}] ({webhook.name}): {absent}, so its secret was not checked; "
                "evald run refuses to start without it",
                file=sys.stderr,
            )
    return 0


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
    config = _load(args)
    database = _open_current(config)
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
    config = _load(args)
    database = _open_current(config)
    try:
        with database.session() as session:
            attempts = queries.job_history(session, args.job)
    finally:
        database.dispose()
    if not attempts:
        raise EvaldError(f"job {args.job}: no worker has run it (see `evald status` for job ids)")
    print(report.history(attempts, args.format))
    return 0


def cmd_samples(args: argparse.Namespace) -> int:
    config = _load(args)
    database = _open_current(config)
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
    config = _load(args)
    database = _open_current(config)
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


def _run_results(
    session: Session,
    run: str,
    *,
    task: str | None = None,
    stage: str | None = None,
    metric: str | None = None,
) -> list[queries.ResultRow]:
    """One run's stored results, narrowed; an unknown run, task, stage or metric is an error that names
    what exists."""
    rows = queries.result_rows(session, run=run)
    if not rows:
        known = ", ".join(r.name for r in queries.run_rows(session) if r.evaluated_step is not None) or "none"
        raise EvaldError(f"run {run!r} has no stored results (runs with results: {known})")
    for field, wanted in (("task", task), ("stage", stage), ("metric", metric)):
        if wanted is None:
            continue
        have = sorted({str(getattr(r, field)) for r in rows})
        if wanted not in have:
            raise EvaldError(f"run {run!r} has no {field} {wanted!r} here (its {field}s: {', '.join(have)})")
        rows = [r for r in rows if getattr(r, field) == wanted]
    return rows


def cmd_compare(args: argparse.Namespace) -> int:
    if len(args.run) != 2:
        raise ConfigError("--run", [f"give exactly two runs (--run A --run B), got {len(args.run)}"])
    if not (0 < args.fdr < 1):
        raise ConfigError(
            "--fdr", [f"must be a false discovery rate between 0 and 1 (e.g. 0.05), got {args.fdr}"]
        )
    smoothing = parse_smoothing(args.smooth)
    run_a, run_b = args.run
    config = _load(args)
    database = _open_current(config)
    try:
        with database.session() as session:
            a, b = (
                _run_results(session, run, task=args.task, stage=args.stage, metric=args.metric)
                for run in (run_a, run_b)
            )
            # The samples of the matched points of metrics the samples rebuild: for the paired test.
            keys = {
                (r.task, r.stage, r.step)
                for r in a
                if r.step is not None and r.metric in curves.PAIRED_SCORES
            }
            keys &= {(r.task, r.stage, r.step) for r in b if r.step is not None}
            grades_a, grades_b = (grades.job_grades(session, run=run, keys=keys) for run in (run_a, run_b))
    finally:
        database.dispose()
    found = curves.compare(
        curves.curves(a),
        curves.curves(b),
        run_a=run_a,
        run_b=run_b,
        smoothing=smoothing,
        fdr=args.fdr,
        grades_a=grades_a,
        grades_b=grades_b,
    )
    print(report.comparison(found, args.format))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from daemon.alerts.lifecycle import Alerter
    from daemon.plot import PlotFormatError, plot_format, render  # matplotlib is slow to import

    smoothing = parse_smoothing(args.smooth)
    runs = list(dict.fromkeys(args.run))
    out = Path(args.out)
    try:
        plot_format(out)
    except PlotFormatError as exc:
        raise ConfigError("--out", [str(exc)]) from exc
    config = _load(args)
    database = _open_current(config)
    try:
        with database.session() as session:
            rows = [
                row
                for run in runs
                for row in _run_results(session, run, task=args.task, stage=args.stage, metric=args.metric)
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


def cmd_export_tensorboard(args: argparse.Namespace) -> int:
    from daemon.export.tensorboard import write_events

    config = _load(args)
    database = _open_current(config)
    try:
        with database.session() as session:
            rows = _run_results(session, args.run)
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
    from daemon.trackers.backfill import backfill, pick_tracker

    config = _load(args)
    tracker = pick_tracker(config, args.export_command, args.tracker)
    database = _open_current(config)
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

    config = _load(args)
    database = _open_current(config)
    try:
        with database.session() as session:
            rows = _run_results(session, args.run)
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


def cmd_webhook_test(args: argparse.Namespace) -> int:
    from daemon.alerts.relay import endpoints, send_test

    config = _load(args)
    known = {w.name: w for w in config.webhooks}
    if args.name not in known:
        names = ", ".join(known) or "none configured"
        raise ConfigError("webhook", [f"unknown webhook {args.name!r} (known: {names})"])
    # Only this webhook's secret: another's missing one is no reason to refuse a test of this one.
    [target] = endpoints(config.model_copy(update={"webhooks": (known[args.name],)}), os.environ)
    result = send_test(target, config.alerts.links)
    answer = f"HTTP {result.status}" if result.status is not None else "no answer"
    print(f"{args.name}: {answer} in {result.duration_s:.3f} s (webhook-id {result.event_id})")
    if result.detail:
        print(report.one_line(result.detail, 500))
    delivered = result.status is not None and 200 <= result.status < 300
    if delivered:
        # It takes alerts again: one that answered 410 Gone before is enabled for the relay.
        database = _open_current(config)
        try:
            with database.session() as session:
                alerting.enable_endpoint(session, args.name)
        finally:
            database.dispose()
    return 0 if delivered else 1


def cmd_status(args: argparse.Namespace) -> int:
    config = _load(args)
    database = _open_current(config)
    try:
        with database.session() as session:
            checkpoints = queries.checkpoint_rows(session)
            jobs = queries.job_rows(session)
            plans = scheduling.plan_rows(session)
            stored = scheduling.schedules(session)
            ignored = queries.ignored_rows(session)
            alternates = queries.alternate_rows(session)
            scheduled = executor_states(session)
            latest = queries.latest_results(session)
    finally:
        database.dispose()
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
    cluster = slurm_queue(config)
    # The thresholds as they stand now, read the way the daemon reads them before starting a job.
    probe = resource_probe(config)
    check = probe.check() if probe is not None else None
    if args.format == "json":
        shown: dict[str, Any] = {"runs": runs, "resources": report.resources(check)}
        if cluster is not None:
            shown["slurm"] = cluster
        print(json.dumps(shown, indent=1))
    else:
        print(report.status_text(runs))
        print(report.resources_text(check))
        if cluster is not None:
            print(report.cluster_text(cluster))
    return 0


def slurm_queue(config: Config) -> dict[str, Any] | None:
    """evald's jobs in the Slurm queue now (``[executor] kind = "slurm"``; None otherwise): id, evald job
    and attempt, run, state, reason, nodes; or the error that kept squeue from answering."""
    try:
        executor = remote.make_executor(config)
    except ExecutorError as exc:
        return {"partition": config.executor.partition, "prefix": "", "error": str(exc), "jobs": []}
    if executor is None:
        return None
    out: dict[str, Any] = {"partition": config.executor.partition, "prefix": config.executor.name_prefix}
    try:
        active = executor.active()
    except (ExecutorUnavailable, SlurmError) as exc:
        return {**out, "error": str(exc), "jobs": []}
    try:
        executor.check()
    except (ExecutorError, ExecutorUnavailable, SlurmError) as exc:
        # What keeps the daemon from submitting (no such partition): its jobs wait in evald's queue.
        out["problem"] = str(exc)
    out["jobs"] = [
        {
            "slurm_job_id": job.job_id,
            "job": ref.job_id,
            "attempt": ref.attempt,
            "run": ref.run,
            "state": job.state,
            "reason": job.reason,
            "nodes": job.nodes or None,
        }
        for ref, job in sorted(active, key=lambda pair: int(pair[1].job_id))
    ]
    return out


def evaluate_now(
    config: Config,
    checkpoint: Path,
    task_names: Sequence[str],
    *,
    layout: str = "auto",
    hf_config: Path | None = None,
    inference: InferenceSpec | None = None,
) -> list[tuple[str, JobResult]]:
    """Run the worker (group) on one checkpoint for each task, with no daemon and no database."""
    from daemon.running.environment import worker_environment
    from daemon.running.workers import WorkerProcess, read_outcome

    try:
        snapshot = layouts.take_snapshot(checkpoint)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise EvaldError(f"{checkpoint}: not a checkpoint folder") from exc
    detected = layouts.detect(checkpoint, snapshot, layout)
    if detected is None:
        raise EvaldError(
            f"{checkpoint}: no known checkpoint layout recognised (known: {', '.join(layouts.REGISTRY)})"
        )
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="evald-eval-") as tmp:
        for number, name in enumerate(task_names):
            task = config.task(name)
            if task is None:
                raise ConfigError(
                    "--task", [f"unknown task {name!r} (defined: {', '.join(t.name for t in config.tasks)})"]
                )
            folder = Path(tmp) / str(number)
            folder.mkdir()
            spec = JobSpec(
                job_id=0,
                checkpoint_path=checkpoint.resolve(),
                layout=detected,
                hf_config=hf_config,
                task=task.spec(),
                inference=inference or config.inference.spec(),
                result_path=folder / "result.json",
                seed=config.inference.seed,
                max_samples=config.inference.max_samples,
                max_text_chars=config.inference.max_text_chars,
            )
            spec_path = folder / "spec.json"
            spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
            python = str(config.inference.python or sys.executable)
            command = worker_command(
                spec.inference,
                spec_path,
                python=python,
                hostfile=config.inference.hostfile,
                launcher_args=config.inference.launcher_args,
            )
            worker = WorkerProcess.start(command, folder / "worker.log", worker_environment(config))
            try:
                code = worker.wait()
            finally:
                # Interrupted (Ctrl-C) or done: no rank is left holding a GPU.
                worker.kill()
            outcome = read_outcome(spec, code, worker.log_path)
            if outcome.result is None:
                raise EvaldError(f"{checkpoint}: {outcome.error_kind}: {outcome.error}")
            result = outcome.result
            outcomes.append((name, result))
    return outcomes


def override_layout(
    inference: InferenceConfig, *, engine: str | None, tp: int | None, dp: int | None
) -> InferenceSpec:
    """The configured inference with the command line's engine, tp and dp, validated like the config."""
    changes = {k: v for k, v in {"engine": engine, "tp": tp, "dp": dp}.items() if v is not None}
    try:
        merged = InferenceConfig.model_validate({**inference.model_dump(), **changes})
    except ValidationError as exc:
        problems = [
            f"{'--' + '.'.join(map(str, e['loc'])) if e['loc'] else '--engine/--tp/--dp'}: "
            + str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        ]
        raise ConfigError("command line", problems) from exc
    return merged.spec()


def cmd_eval(args: argparse.Namespace) -> int:
    config = _load(args)
    names = [args.task] if args.task else [t.name for t in config.tasks]
    hf_config = Path(args.hf_config).resolve() if args.hf_config else None
    inference = override_layout(config.inference, engine=args.engine, tp=args.tp, dp=args.dp)
    outcomes = evaluate_now(
        config, Path(args.checkpoint), names, layout=args.layout, hf_config=hf_config, inference=inference
    )
    if args.format == "json":
        payload: list[dict[str, Any]] = [
            {
                "task": name,
                # None for a metric over no samples (n = 0): no number, not NaN in the JSON.
                "metrics": {m.name: None if m.n == 0 else m.value for m in r.metrics},
                "n": {m.name: m.n for m in r.metrics},
                "stderr": {m.name: m.stderr for m in r.metrics},
                "problems": [p.model_dump() for p in r.problems],
            }
            for name, r in outcomes
        ]
        print(json.dumps({"checkpoint": str(Path(args.checkpoint).resolve()), "tasks": payload}, indent=1))
    else:
        rows = [
            (name, m.name, report.NO_SAMPLES if m.n == 0 else m.value, m.n, m.stderr)
            for name, r in outcomes
            for m in r.metrics
        ]
        print(report.table(("task", "metric", "value", "n", "stderr"), rows))
        for name, r in outcomes:
            for problem in r.problems:
                print(f"{name}: left out: {problem.where}: {report.one_line(problem.message)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from daemon.web.exposure import open_problem
    from daemon.web.server import serve

    config = _load(args)
    host = args.host or config.web.host
    exposed = open_problem(config.web, host)
    if exposed is not None and not (args.insecure_no_token or config.web.allow_open):
        raise ConfigError("web.host", [f"evald serve refused: {exposed}"])
    logs.configure(sys.stdout, fmt=config.daemon.log_format, level=config.daemon.log_level)
    if exposed is not None:
        structlog.get_logger("daemon.web").warning("web.open_without_token", host=host)
    serve(config, host=host, port=args.port or config.web.port)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from daemon.demo import run_demo

    workdir = Path(args.workdir) if args.workdir else None
    return run_demo(workdir, as_json=args.json, serve=args.serve, port=args.port)


def _name(value: str) -> str:
    """A ``--run``/``--task``/``--metric`` value, checked as the API checks its filters."""
    try:
        return filter_values.check_text(value)
    except filter_values.ValueRefused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _step(value: str) -> int:
    """A ``--step``/``--step-min``/``--step-max`` value: in the range every database can hold."""
    try:
        return filter_values.parse_integer(value)
    except filter_values.ValueRefused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _job_id(value: str) -> int:
    try:
        return filter_values.parse_integer(value, minimum=1)
    except filter_values.ValueRefused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evald", description="Sidecar evaluation daemon for LLM RL training."
    )
    parser.add_argument("--config", help="config file (default: $EVALD_CONFIG, then ./evald.toml)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    commands.add_parser("run", help="run the daemon in the foreground (what systemd starts)").set_defaults(
        func=cmd_run
    )

    serve = commands.add_parser("serve", help="the read-only HTTP API, dashboard and /metrics")
    serve.add_argument("--host", help="address to bind (default: [web] host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: [web] port, 8321)")
    serve.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve a non-loopback --host without a token anyway (the data is open to the network)",
    )
    serve.set_defaults(func=cmd_serve)

    demo = commands.add_parser("demo", help="train a tiny model and watch evald evaluate every checkpoint")
    demo.add_argument(
        "--workdir", help="where the demo builds its workspace (default: a new temporary folder)"
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.add_argument(
        "--serve", action="store_true", help="serve the dashboard while it runs, and after it until Ctrl-C"
    )
    demo.add_argument("--port", type=int, default=0, help="the dashboard's port (default: any free one)")
    demo.set_defaults(func=cmd_demo)

    evaluate = commands.add_parser("eval", help="evaluate one checkpoint now, without the daemon")
    evaluate.add_argument("checkpoint")
    evaluate.add_argument("--task", type=_name, help="only this task (default: every task in the config)")
    evaluate.add_argument("--format", choices=("table", "json"), default="table")
    evaluate.add_argument("--layout", default="auto", help="checkpoint layout (default: detect it)")
    evaluate.add_argument("--hf-config", help="folder with config.json for checkpoints that have none")
    evaluate.add_argument("--engine", choices=("deepspeed", "hf"), help="override [inference] engine")
    evaluate.add_argument("--tp", type=int, help="override [inference] tp: tensor-parallel ranks per replica")
    evaluate.add_argument("--dp", type=int, help="override [inference] dp: data-parallel replicas")
    evaluate.set_defaults(func=cmd_eval)

    results = commands.add_parser("results", help="stored results")
    results.add_argument("--run", type=_name)
    results.add_argument("--task", type=_name)
    results.add_argument("--stage", choices=(stages.FULL, stages.QUICK))
    results.add_argument("--metric", type=_name)
    results.add_argument("--step-min", help="only steps at or above this (inclusive)")
    results.add_argument("--step-max", help="only steps at or below this (inclusive)")
    results.add_argument("--steps", metavar="A:B", help="a step range, inclusive (100:500, 100: or :500)")
    results.add_argument("--format", choices=("table", "json", "csv"), default="table")
    results.set_defaults(func=cmd_results)

    alerts = commands.add_parser("alerts", help="alerts: what fired, when, and whether it was delivered")
    alerts.add_argument("--run", type=_name, help="only this run")
    alerts.add_argument("--state", choices=("firing", "resolved"), help="only alerts in this state")
    alerts.add_argument("--format", choices=("table", "json"), default="table")
    alerts.set_defaults(func=cmd_alerts)

    compare = commands.add_parser(
        "compare", help="two runs at matched steps: the difference, tested (paired where prompts are shared)"
    )
    compare.add_argument(
        "--run", action="append", type=_name, required=True, help="give twice: --run A --run B"
    )
    compare.add_argument(
        "--metric", type=_name, help="only this metric (default: every metric both runs have)"
    )
    compare.add_argument("--task", type=_name, help="only this task")
    compare.add_argument("--stage", choices=(stages.FULL, stages.QUICK), help="only this stage")
    compare.add_argument("--smooth", default="none", help="none (default), ema:W (e.g. ema:0.6) or window:N")
    compare.add_argument(
        "--fdr",
        type=float,
        default=curves.FDR,
        help="false discovery rate over every point tested, Benjamini-Hochberg (default: 0.05)",
    )
    compare.add_argument("--format", choices=("table", "json", "csv"), default="table")
    compare.set_defaults(func=cmd_compare)

    plot = commands.add_parser(
        "plot", help="a metric's curves as a PNG, PDF or SVG: error bands, alerts, best checkpoint"
    )
    plot.add_argument(
        "--run", action="append", type=_name, required=True, help="a run to draw (repeat to overlay runs)"
    )
    plot.add_argument("--metric", type=_name, required=True)
    plot.add_argument(
        "--task", type=_name, help="only this task (default: one curve per task with the metric)"
    )
    plot.add_argument("--stage", choices=(stages.FULL, stages.QUICK), help="only this stage")
    plot.add_argument("--smooth", default="none", help="none (default), ema:W (e.g. ema:0.6) or window:N")
    plot.add_argument("--title", help="the chart's title (default: the metric and runs)")
    plot.add_argument("--out", required=True, help="the file to write: .png, or .pdf/.svg (vector)")
    plot.set_defaults(func=cmd_plot)

    export = commands.add_parser("export", help="write stored results in another tool's format")
    export_commands = export.add_subparsers(dest="export_command", required=True, metavar="FORMAT")
    tensorboard = export_commands.add_parser(
        "tensorboard", help="a run's results as TensorBoard event files (one scalar per metric, x = step)"
    )
    tensorboard.add_argument("--run", type=_name, required=True)
    tensorboard.add_argument("--out", required=True, help="log folder; the files go to OUT/<run>/")
    tensorboard.add_argument(
        "--replace", action="store_true", help="remove event files an earlier export left in OUT/<run>/"
    )
    tensorboard.set_defaults(func=cmd_export_tensorboard)
    lm_eval = export_commands.add_parser(
        "lm-eval", help="one checkpoint's results in lm-evaluation-harness's results JSON shape"
    )
    lm_eval.add_argument("--run", type=_name, required=True)
    lm_eval.add_argument("--step", type=_step, required=True, help="the checkpoint's step")
    lm_eval.add_argument("--out", help="the JSON file to write (default: standard output)")
    lm_eval.set_defaults(func=cmd_export_lm_eval)
    for kind in ("mlflow", "wandb"):
        tracker = export_commands.add_parser(
            kind, help=f"send a run's stored results to the [[trackers]] {kind} (idempotent backfill)"
        )
        tracker.add_argument("--run", type=_name, required=True)
        tracker.add_argument("--tracker", help="the tracker's name, when several of this kind are configured")
        tracker.set_defaults(func=cmd_export_tracker)

    webhook = commands.add_parser("webhook", help="webhook tools")
    webhook_commands = webhook.add_subparsers(dest="webhook_command", required=True)
    test = webhook_commands.add_parser(
        "test", help="send a signed test alert to a webhook and show the answer"
    )
    test.add_argument("name", help="the webhook's name in the config")
    test.set_defaults(func=cmd_webhook_test)

    history = commands.add_parser("history", help="every worker run of one job: retries, OOM, errors")
    history.add_argument("job", type=_job_id, help="job id (as `evald status` shows it)")
    history.add_argument("--format", choices=("table", "json"), default="table")
    history.set_defaults(func=cmd_history)

    samples = commands.add_parser(
        "samples", help="one job's per-sample outputs, and the inputs it left out of its metrics"
    )
    samples.add_argument("--run", type=_name, required=True)
    samples.add_argument("--step", type=_step, required=True, help="the checkpoint's step")
    samples.add_argument("--task", type=_name, required=True)
    samples.add_argument(
        "--stage", choices=(stages.FULL, stages.QUICK), help="default: full where it ran, else quick"
    )
    samples.add_argument(
        "--wrong-only", action="store_true", help="only samples graded wrong (not those left out by an error)"
    )
    samples.add_argument("--format", choices=("table", "json"), default="table")
    samples.set_defaults(func=cmd_samples)

    status = commands.add_parser("status", help="checkpoints and jobs by state, per run")
    status.add_argument("--format", choices=("table", "json"), default="table")
    status.set_defaults(func=cmd_status)

    config = commands.add_parser("config", help="config file tools")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    check = config_commands.add_parser("check", help="validate a config file")
    check.add_argument("file")
    check.set_defaults(func=cmd_config_check)

    db = commands.add_parser("db", help="database tools")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    db_commands.add_parser("upgrade", help="apply schema migrations").set_defaults(func=cmd_db_upgrade)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(sys.stderr)
    try:
        code: int = args.func(args)
        # Flushed here, where a reader that has gone is caught, not at exit.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader (`evald results | head`) stopped reading: the rest has nowhere to go, and the
        # interpreter's own flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"evald: {exc.source}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except (EvaldError, StorageError, InferenceError) as exc:
        print(f"evald: error: {report.one_line(str(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except DBAPIError as exc:
        # One line instead of a driver traceback, named for what it is: the database went away, or it
        # refused a statement (a bug to report, not something to wait out).
        kind = DatabaseUnreachable if is_outage(exc) else StatementFailed
        reason = report.one_line(str(exc.orig) if exc.orig else str(exc))
        print(f"evald: error: {kind.__name__}: {type(exc.orig or exc).__name__}: {reason}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    finally:
        structlog.reset_defaults()


if __name__ == "__main__":
    sys.exit(main())
