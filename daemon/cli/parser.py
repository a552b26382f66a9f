"""``evald``'s arguments: every command, its options and help, and the handler each one calls."""

from __future__ import annotations

import argparse

from daemon import filter_values
from daemon.analysis import curves
from daemon.cli import retry
from daemon.cli.config_check import cmd_config_check
from daemon.cli.db import cmd_db_upgrade
from daemon.cli.evaluate import cmd_eval
from daemon.cli.export import cmd_export_lm_eval, cmd_export_tensorboard, cmd_export_tracker
from daemon.cli.results import cmd_alerts, cmd_compare, cmd_history, cmd_plot, cmd_results, cmd_samples
from daemon.cli.run import cmd_demo, cmd_run, cmd_serve
from daemon.cli.status import cmd_status
from daemon.cli.webhook import cmd_webhook_test
from daemon.scheduling import stages


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
    retry.add_parser(commands, job_id=_job_id, name=_name, step=_step)

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
