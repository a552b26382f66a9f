"""One toy checkpoint's evaluation three ways, on the same problems: evald's own ``generate`` task,
the same data as an lm-eval task through evald (``kind = "lm_eval"``), and that lm-eval task run by the
``lm_eval`` command as a user would. The first two run in this process one after the other (each loads the
checkpoint, as a worker does); the third is its own process, and its wall time includes its start.

    python -m bench.lm_eval_speed --checkpoint RUN/step_30 --limit 200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from inference.group import WorkerGroup
from inference.spec import HarnessSpec, InferenceSpec, JobSpec, TaskSpec
from inference.task import run_task
from inference.toy.problems import DATA_DIR, PROMPT_TEMPLATE

TOY_TASKS = Path(__file__).resolve().parent.parent / "inference" / "toy" / "lm_eval"


def _timed(task: TaskSpec, checkpoint: Path, folder: Path, threads: int) -> tuple[float, float]:
    spec = JobSpec(
        job_id=1,
        checkpoint_path=checkpoint,
        task=task,
        inference=InferenceSpec(engine="hf", threads=threads),
        result_path=folder / "result.json",
    )
    started = time.perf_counter()
    result = run_task(spec, WorkerGroup.start(spec.inference))
    assert result is not None and result.timing is not None
    return time.perf_counter() - started, result.timing.eval_s


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lm_eval_speed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-cli", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        generate = TaskSpec(
            name="arith",
            dataset=DATA_DIR / "arith500.jsonl",
            prompt_template=PROMPT_TEMPLATE,
            limit=args.limit,
            batch_size=args.batch_size,
            metrics=("exact_match",),
        )
        harness = TaskSpec(
            name="arith",
            kind="lm_eval",
            limit=args.limit,
            batch_size=args.batch_size,
            metrics=(),
            lm_eval=HarnessSpec(task="arith", include_path=TOY_TASKS),
        )
        # One warm-up of each, so neither pays the first import of its libraries in the figure.
        for task in (generate, harness):
            _timed(task.model_copy(update={"limit": 2}), args.checkpoint, Path(tmp), args.threads)
        own_wall, own_eval = _timed(generate, args.checkpoint, Path(tmp), args.threads)
        lm_wall, lm_eval_s = _timed(harness, args.checkpoint, Path(tmp), args.threads)
        figures: dict[str, float] = {
            "problems": args.limit,
            "evald_generate_wall_s": own_wall,
            "evald_generate_eval_s": own_eval,
            "evald_lm_eval_wall_s": lm_wall,
            "evald_lm_eval_eval_s": lm_eval_s,
            "lm_eval_over_generate_eval": lm_eval_s / own_eval,
        }
        if not args.skip_cli:
            command = [
                sys.executable, "-m", "lm_eval", "--model", "hf",
                # lm_eval's own --device (default cuda, or cpu without one) also goes to HFLM: not in
                # model_args as well, which HFLM refuses as a second value.
                "--model_args", f"pretrained={args.checkpoint.resolve()},dtype=float32", "--device", "cpu",
                "--tasks", "arith", "--include_path", str(TOY_TASKS), "--limit", str(args.limit),
                "--batch_size", str(args.batch_size),
            ]  # fmt: skip
            env = {
                **os.environ,
                "HF_DATASETS_OFFLINE": "1",
                "HF_HUB_OFFLINE": "1",
                "OMP_NUM_THREADS": str(args.threads),
            }
            started = time.perf_counter()
            done = subprocess.run(
                command, cwd=TOY_TASKS, env=env, capture_output=True, text=True, check=False
            )
            figures["lm_eval_cli_wall_s"] = time.perf_counter() - started
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            # evald's whole job (load included) against the command's whole run.
            figures["cli_over_evald_lm_eval_wall"] = figures["lm_eval_cli_wall_s"] / lm_wall
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
