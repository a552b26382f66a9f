"""``evald``'s arguments: every command, its options and help, and the handler each one calls.

The parser is built without importing any command's implementation: each command names its handler
(:class:`Handler`, a module of :mod:`daemon.cli` and a function in it) and only the one that runs is
imported, so ``evald --help`` or a typo costs argparse alone and ``evald results`` never imports what
``evald run`` needs. This module imports only the light checks of values (:mod:`daemon.filter_values`)
and the constants that appear in choices and defaults; ``tests/test_cli_imports.py`` holds it there.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from daemon import filter_values
from daemon.analysis.significance import FDR
from daemon.analysis.smoothing import Smoothing, parse_smoothing
from daemon.errors import SmoothingError
from daemon.scheduling.stages import FULL, QUICK

STAGES = (FULL, QUICK)
#: ``add_subparsers()``'s return: argparse does not name its type publicly.
Commands = Any


@dataclass(frozen=True)
class Handler:
    """A command's handler, ``daemon.cli.<module>.<function>``, imported when the command runs."""

    module: str
    function: str

    def resolve(self) -> Callable[[argparse.Namespace], int]:
        handler: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(f"daemon.cli.{self.module}"), self.function
        )
        return handler


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


def _port(value: str) -> int:
    """A ``--port``: 0 (any free one) to 65535."""
    try:
        return filter_values.parse_integer(value.strip(), maximum=65535)
    except filter_values.ValueRefused as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _smoothing(value: str) -> Smoothing:
    """A ``--smooth`` spec, refused here like any malformed option (exit 2), not by the command."""
    try:
        return parse_smoothing(value)
    except SmoothingError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: ``--smooth``'s help, the same for ``compare`` and ``plot``.
SMOOTH_HELP = "none (default), ema:W (e.g. ema:0.6) or window:N"


def _command(commands: Commands, name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = commands.add_parser(name, help=help)
    sub.set_defaults(handler=handler)
    return sub


def _formats(sub: argparse.ArgumentParser, *formats: str) -> None:
    sub.add_argument("--format", choices=("table", *formats), default="table")


def add_daemon_commands(commands: Commands) -> None:
    """The commands that keep running: ``run``, ``serve``, ``demo``."""
    _command(
        commands, "run", Handler("run", "cmd_run"), "run the daemon in the foreground (what systemd starts)"
    )
    serve = _command(
        commands, "serve", Handler("serve", "cmd_serve"), "the read-only HTTP API, dashboard and /metrics"
    )
    serve.add_argument("--host", help="address to bind (default: [web] host, 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="port (default: [web] port, 8321)")
    serve.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve a non-loopback --host without a token anyway (the data is open to the network)",
    )
    demo = _command(
        commands,
        "demo",
        Handler("demo", "cmd_demo"),
        "train a tiny model and watch evald evaluate every checkpoint",
    )
    demo.add_argument(
        "--workdir", help="where the demo builds its workspace (default: a new temporary folder)"
    )
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.add_argument(
        "--serve", action="store_true", help="serve the dashboard while it runs, and after it until Ctrl-C"
    )
    demo.add_argument("--port", type=_port, default=0, help="the dashboard's port (default: any free one)")


def add_eval_command(commands: Commands) -> None:
    """``eval``: one checkpoint now, without the daemon."""
    evaluate = _command(
        commands, "eval", Handler("evaluate", "cmd_eval"), "evaluate one checkpoint now, without the daemon"
    )
    evaluate.add_argument("checkpoint")
    evaluate.add_argument("--task", type=_name, help="only this task (default: every task in the config)")
    evaluate.add_argument("--format", choices=("table", "json"), default="table")
    evaluate.add_argument("--layout", default="auto", help="checkpoint layout (default: detect it)")
    evaluate.add_argument("--hf-config", help="folder with config.json for checkpoints that have none")
    evaluate.add_argument("--engine", choices=("deepspeed", "hf"), help="override [inference] engine")
    evaluate.add_argument("--tp", type=int, help="override [inference] tp: tensor-parallel ranks per replica")
    evaluate.add_argument("--dp", type=int, help="override [inference] dp: data-parallel replicas")
    evaluate.add_argument(
        "--store",
        action="store_true",
        help="store the results in the database as the daemon's job for this run, step and task would be "
        "(without it nothing is stored; storing again the same run, step and task adds nothing)",
    )
    evaluate.add_argument(
        "--run",
        type=_name,
        help="with --store: the configured run the checkpoint is stored under (default: the run whose root "
        "holds it)",
    )


def add_result_commands(commands: Commands) -> None:
    """What was stored, as tables: ``results``, ``alerts``, ``compare``."""
    results = _command(commands, "results", Handler("results", "cmd_results"), "stored results")
    results.add_argument("--run", type=_name)
    results.add_argument("--task", type=_name)
    results.add_argument("--stage", choices=STAGES)
    results.add_argument("--metric", type=_name)
    results.add_argument("--step-min", help="only steps at or above this (inclusive)")
    results.add_argument("--step-max", help="only steps at or below this (inclusive)")
    results.add_argument("--steps", metavar="A:B", help="a step range, inclusive (100:500, 100: or :500)")
    _formats(results, "json", "csv")

    alerts = _command(
        commands,
        "alerts",
        Handler("alerts", "cmd_alerts"),
        "alerts: what fired, when, and whether it was delivered",
    )
    alerts.add_argument("--run", type=_name, help="only this run")
    alerts.add_argument("--state", choices=("firing", "resolved"), help="only alerts in this state")
    _formats(alerts, "json")

    compare = _command(
        commands,
        "compare",
        Handler("compare", "cmd_compare"),
        "two runs at matched steps: the difference, tested (paired where prompts are shared)",
    )
    compare.add_argument(
        "--run", action="append", type=_name, required=True, help="give twice: --run A --run B"
    )
    compare.add_argument(
        "--metric", type=_name, help="only this metric (default: every metric both runs have)"
    )
    compare.add_argument("--task", type=_name, help="only this task")
    compare.add_argument("--stage", choices=STAGES, help="only this stage")
    compare.add_argument("--smooth", type=_smoothing, default="none", help=SMOOTH_HELP)
    compare.add_argument(
        "--fdr",
        type=float,
        default=FDR,
        help="false discovery rate over every point tested, Benjamini-Hochberg (default: 0.05)",
    )
    _formats(compare, "json", "csv")


def add_plot_command(commands: Commands) -> None:
    """``plot``: a metric's curves drawn to a file."""
    plot = _command(
        commands,
        "plot",
        Handler("plot", "cmd_plot"),
        "a metric's curves as a PNG, PDF or SVG: error bands, alerts, best checkpoint",
    )
    plot.add_argument(
        "--run", action="append", type=_name, required=True, help="a run to draw (repeat to overlay runs)"
    )
    plot.add_argument("--metric", type=_name, required=True)
    plot.add_argument(
        "--task", type=_name, help="only this task (default: one curve per task with the metric)"
    )
    plot.add_argument("--stage", choices=STAGES, help="only this stage")
    plot.add_argument("--smooth", type=_smoothing, default="none", help=SMOOTH_HELP)
    plot.add_argument("--title", help="the chart's title (default: the metric and runs)")
    plot.add_argument("--out", required=True, help="the file to write: .png, or .pdf/.svg (vector)")


def add_export_commands(commands: Commands) -> None:
    """``export FORMAT``: stored results in TensorBoard's, lm-eval's or a tracker's shape."""
    export = commands.add_parser("export", help="write stored results in another tool's format")
    formats = export.add_subparsers(dest="export_command", required=True, metavar="FORMAT")
    tensorboard = _command(
        formats,
        "tensorboard",
        Handler("export", "cmd_export_tensorboard"),
        "a run's results as TensorBoard event files (one scalar per metric, x = step)",
    )
    tensorboard.add_argument("--run", type=_name, required=True)
    tensorboard.add_argument("--out", required=True, help="log folder; the files go to OUT/<run>/")
    tensorboard.add_argument(
        "--replace", action="store_true", help="remove event files an earlier export left in OUT/<run>/"
    )
    lm_eval = _command(
        formats,
        "lm-eval",
        Handler("export", "cmd_export_lm_eval"),
        "one checkpoint's results in lm-evaluation-harness's results JSON shape",
    )
    lm_eval.add_argument("--run", type=_name, required=True)
    lm_eval.add_argument("--step", type=_step, required=True, help="the checkpoint's step")
    lm_eval.add_argument("--out", help="the JSON file to write (default: standard output)")
    for kind in ("mlflow", "wandb"):
        tracker = _command(
            formats,
            kind,
            Handler("export", "cmd_export_tracker"),
            f"send a run's stored results to the [[trackers]] {kind} (idempotent backfill)",
        )
        tracker.add_argument("--run", type=_name, required=True)
        tracker.add_argument("--tracker", help="the tracker's name, when several of this kind are configured")


def add_webhook_commands(commands: Commands) -> None:
    """``webhook test``."""
    webhook = commands.add_parser("webhook", help="webhook tools")
    tools = webhook.add_subparsers(dest="webhook_command", required=True)
    test = _command(
        tools,
        "test",
        Handler("webhook", "cmd_webhook_test"),
        "send a signed test alert to a webhook and show the answer",
    )
    test.add_argument("name", help="the webhook's name in the config")


def add_job_commands(commands: Commands) -> None:
    """One job's story and what to do about it: ``history``, ``retry``, ``samples``."""
    history = _command(
        commands,
        "history",
        Handler("history", "cmd_history"),
        "every worker run of one job: retries, OOM, errors",
    )
    history.add_argument("job", type=_job_id, help="job id (as `evald status` shows it)")
    _formats(history, "json")

    retry = _command(
        commands,
        "retry",
        Handler("retry", "cmd_retry"),
        "queue a failed or cancelled job again (by id, or a run's with --failed/--cancelled)",
    )
    retry.add_argument("job", nargs="?", type=_job_id, help="the job's id (as `evald status` shows it)")
    retry.add_argument("--run", type=_name, help="retry this run's jobs: with --failed and/or --cancelled")
    retry.add_argument("--failed", action="store_true", help="the run's failed jobs (cancelled ones too)")
    retry.add_argument(
        "--cancelled", action="store_true", help="the run's jobs cancelled (scancel, checkpoint deleted)"
    )
    retry.add_argument("--step", type=_step, help="only the jobs of the checkpoint at this step")
    retry.add_argument("--task", type=_name, help="only this task's jobs")
    _formats(retry, "json")

    samples = _command(
        commands,
        "samples",
        Handler("samples", "cmd_samples"),
        "one job's per-sample outputs, and the inputs it left out of its metrics",
    )
    samples.add_argument("--run", type=_name, required=True)
    samples.add_argument("--step", type=_step, required=True, help="the checkpoint's step")
    samples.add_argument("--task", type=_name, required=True)
    samples.add_argument("--stage", choices=STAGES, help="default: full where it ran, else quick")
    samples.add_argument(
        "--wrong-only", action="store_true", help="only samples graded wrong (not those left out by an error)"
    )
    _formats(samples, "json")


def add_status_command(commands: Commands) -> None:
    """``status``: the runs, the queue and the resources now."""
    status = _command(
        commands, "status", Handler("status", "cmd_status"), "checkpoints and jobs by state, per run"
    )
    _formats(status, "json")


def add_tool_commands(commands: Commands) -> None:
    """``config check`` and ``db upgrade``."""
    config = commands.add_parser("config", help="config file tools")
    config_tools = config.add_subparsers(dest="config_command", required=True, metavar="COMMAND")
    check = _command(
        config_tools, "check", Handler("config_check", "cmd_config_check"), "validate a config file"
    )
    check.add_argument(
        "file", nargs="?", help="the config file (default: --config, then $EVALD_CONFIG, then ./evald.toml)"
    )
    db = commands.add_parser("db", help="database tools")
    db_tools = db.add_subparsers(dest="db_command", required=True, metavar="COMMAND")
    _command(db_tools, "upgrade", Handler("db", "cmd_db_upgrade"), "apply schema migrations")


#: Every group of commands, in the order ``evald --help`` lists them.
GROUPS: tuple[Callable[[Commands], None], ...] = (
    add_daemon_commands,
    add_eval_command,
    add_result_commands,
    add_plot_command,
    add_export_commands,
    add_webhook_commands,
    add_job_commands,
    add_status_command,
    add_tool_commands,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evald", description="Sidecar evaluation daemon for LLM RL training."
    )
    parser.add_argument("--config", help="config file (default: $EVALD_CONFIG, then ./evald.toml)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in GROUPS:
        add(commands)
    return parser
