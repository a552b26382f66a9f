"""``evald eval``: one checkpoint evaluated now by the worker, with no daemon; stored in the database only
with ``--store`` (:mod:`daemon.cli.eval_storage`), and said so when it is not."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from daemon.analysis import report
from daemon.cli import eval_storage
from daemon.cli.base import load
from daemon.cli.eval_storage import Evaluated
from daemon.config import Config, InferenceConfig, RunConfig, TaskConfig
from daemon.errors import ConfigError, EvaldError
from inference import layouts
from inference.launcher import worker_command
from inference.spec import InferenceSpec, JobResult, JobSpec
from storage.models import utcnow


@dataclass(frozen=True)
class Target:
    """What ``evald eval`` evaluates: a checkpoint folder of ``layout`` (as :func:`detect_layout` tells
    it), with ``hf_config`` for checkpoints that have no config.json and ``inference`` (None: the
    config's). With ``run``, the run it is stored under, its settings are the spec's as in the daemon's
    jobs (its hf_config unless one is given, its root, its base model)."""

    checkpoint: Path
    layout: str
    hf_config: Path | None = None
    inference: InferenceSpec | None = None
    run: RunConfig | None = None


def evaluate_now(
    config: Config,
    target: Target,
    task_names: Sequence[str],
    each: Callable[[Evaluated], None] = lambda _: None,
) -> list[Evaluated]:
    """Run the worker (group) on one checkpoint for each task, with no daemon; ``each`` is handed each
    task's evaluation as soon as it ends (``--store`` stores it then, whatever the next task does)."""
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="evald-eval-") as tmp:
        for number, name in enumerate(task_names):
            folder = Path(tmp) / str(number)
            folder.mkdir()
            spec = _job_spec(config, target, _task(config, name), folder)
            started = utcnow()
            result = _run_worker(config, spec, target.checkpoint)
            outcomes.append(Evaluated(name, spec, result, started_at=started, finished_at=utcnow()))
            each(outcomes[-1])
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


def _job_spec(config: Config, target: Target, task: TaskConfig, folder: Path) -> JobSpec:
    run = target.run
    return JobSpec(
        job_id=0,
        checkpoint_path=target.checkpoint.resolve(),
        layout=target.layout,
        hf_config=target.hf_config or (run.hf_config if run is not None else None),
        run_root=run.root if run is not None else None,
        base_model=run.base_model if run is not None else None,
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
    if args.run is not None and not args.store:
        raise ConfigError("--run", ["names the run to store under: only with --store"])
    checkpoint = Path(args.checkpoint)
    hf_config = Path(args.hf_config).resolve() if args.hf_config else None
    inference = override_layout(config.inference, engine=args.engine, tp=args.tp, dp=args.dp)
    layout = detect_layout(checkpoint, args.layout)
    # Where to store, the tasks and the database are checked before the worker runs, not after.
    where = eval_storage.place(config, checkpoint, layout, args.run) if args.store else None
    names = eval_storage.task_names(config, args.task, where.run if where else None)
    target = Target(checkpoint, layout, hf_config, inference, where.run if where else None)
    with eval_storage.Keeper(config, where) as keeper:
        evaluated = evaluate_now(config, target, names, keeper.keep)
    _print(args.format, checkpoint, evaluated, keeper.stored)
    if where is None:
        print(f"evald: {_not_stored(config, checkpoint, layout)}", file=sys.stderr)
    return 0


def _print(
    form: str,
    checkpoint: Path,
    evaluated: Sequence[Evaluated],
    stored: Sequence[eval_storage.Stored],
) -> None:
    """The results as a table (problems and what was stored after it) or as JSON."""
    if form == "json":
        payload: list[dict[str, Any]] = [
            {
                "task": e.task,
                # None for a metric over no samples (n = 0): no number, not NaN in the JSON.
                "metrics": {m.name: None if m.n == 0 else m.value for m in e.result.metrics},
                "n": {m.name: m.n for m in e.result.metrics},
                "stderr": {m.name: m.stderr for m in e.result.metrics},
                "problems": [p.model_dump() for p in e.result.problems],
            }
            for e in evaluated
        ]
        kept = [s.as_json() for s in stored]
        shown = {"checkpoint": str(checkpoint.resolve()), "tasks": payload, "stored": kept}
        print(json.dumps(shown, indent=1))
        return
    rows = [
        (e.task, m.name, report.NO_SAMPLES if m.n == 0 else m.value, m.n, m.stderr)
        for e in evaluated
        for m in e.result.metrics
    ]
    print(report.table(("task", "metric", "value", "n", "stderr"), rows))
    for e in evaluated:
        for problem in e.result.problems:
            print(f"{e.task}: left out: {problem.where}: {report.one_line(problem.message)}")
    for done in stored:
        print(done.line())


def _not_stored(config: Config, checkpoint: Path, layout: str) -> str:
    """What a person is told when nothing was stored: that, and the command that stores it."""
    try:
        where = eval_storage.place(config, checkpoint, layout, None)
        hint = f"add --store to store them as run {where.run.name!r}'s step {where.step}"
    except Exception:  # only a hint: whatever keeps it from naming the run, the results are printed already
        hint = "add --store (and --run NAME for a checkpoint under no run's root) to store them"
    return (
        "nothing was stored: without --store `evald eval` only prints its results, and `evald results` "
        f"will not show them; {hint}"
    )
