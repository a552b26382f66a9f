"""``evald eval``: one checkpoint evaluated now by the worker, with no daemon and no database."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from daemon.analysis import report
from daemon.cli.base import load
from daemon.config import Config, InferenceConfig
from daemon.errors import ConfigError, EvaldError
from inference import layouts
from inference.launcher import worker_command
from inference.spec import InferenceSpec, JobResult, JobSpec


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
    config = load(args)
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
