"""``evald eval``: one checkpoint evaluated now by the worker, with no daemon and no database."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from daemon.analysis import report
from daemon.cli.base import load
from daemon.config import Config, InferenceConfig, TaskConfig
from daemon.errors import ConfigError, EvaldError
from inference import layouts
from inference.launcher import worker_command
from inference.spec import InferenceSpec, JobResult, JobSpec


@dataclass(frozen=True)
class Target:
    """What ``evald eval`` evaluates: a checkpoint folder, read as ``layout`` (``auto``: detected), with
    ``hf_config`` for checkpoints that have no config.json and ``inference`` (None: the config's)."""

    checkpoint: Path
    layout: str = "auto"
    hf_config: Path | None = None
    inference: InferenceSpec | None = None


def evaluate_now(config: Config, target: Target, task_names: Sequence[str]) -> list[tuple[str, JobResult]]:
    """Run the worker (group) on one checkpoint for each task, with no daemon and no database."""
    detected = detect_layout(target.checkpoint, target.layout)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="evald-eval-") as tmp:
        for number, name in enumerate(task_names):
            folder = Path(tmp) / str(number)
            folder.mkdir()
            spec = _job_spec(config, target, detected, _task(config, name), folder)
            outcomes.append((name, _run_worker(config, spec, target.checkpoint)))
    return outcomes


def detect_layout(checkpoint: Path, layout: str) -> str:
    """``checkpoint``'s layout: ``layout`` when named, else the one its files show."""
    try:
        snapshot = layouts.take_snapshot(checkpoint)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise EvaldError(f"{checkpoint}: not a checkpoint folder") from exc
    detected = layouts.detect(checkpoint, snapshot, layout)
    if detected is None:
        raise EvaldError(
            f"{checkpoint}: no known checkpoint layout recognised (known: {', '.join(layouts.REGISTRY)})"
        )
    return detected


def _task(config: Config, name: str) -> TaskConfig:
    task = config.task(name)
    if task is None:
        raise ConfigError(
            "--task", [f"unknown task {name!r} (defined: {', '.join(t.name for t in config.tasks)})"]
        )
    return task


def _job_spec(config: Config, target: Target, layout: str, task: TaskConfig, folder: Path) -> JobSpec:
    return JobSpec(
        job_id=0,
        checkpoint_path=target.checkpoint.resolve(),
        layout=layout,
        hf_config=target.hf_config,
        task=task.spec(),
        inference=target.inference or config.inference.spec(),
        result_path=folder / "result.json",
        seed=config.inference.seed,
        max_samples=config.inference.max_samples,
        max_text_chars=config.inference.max_text_chars,
    )


def _run_worker(config: Config, spec: JobSpec, checkpoint: Path) -> JobResult:
    """The worker (group) run on ``spec`` in its folder, to its end; its result, or its error raised."""
    from daemon.running.environment import worker_environment
    from daemon.running.workers import WorkerProcess, read_outcome

    folder = spec.result_path.parent
    spec_path = folder / "spec.json"
    spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
    command = worker_command(
        spec.inference,
        spec_path,
        python=str(config.inference.python or sys.executable),
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
    return outcome.result


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
    target = Target(Path(args.checkpoint), args.layout, hf_config, inference)
    outcomes = evaluate_now(config, target, names)
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
