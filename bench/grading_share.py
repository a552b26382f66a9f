"""Grading's share of a whole job: a tiny model trained on the spot, evaluated on 1,000 held-out problems.

Each job runs as the daemon runs it: a worker process (``python -m inference.worker SPEC``: dataset, model
load, batched generation, math-verify grading, the built-in reward, every metric), timed from spawn to
exit, which is the job's duration in the database. The worker times its grading (``Timing.grading_s``:
grading and rewards) and its evaluation (``Timing.eval_s``: loading excluded) inside the same run, so
both shares are ratios measured in one process. Target: grading under 10% of the job.

    python -m bench.grading_share [--steps 480] [--problems 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from inference.spec import InferenceSpec, JobResult, JobSpec, TaskSpec, Timing
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from inference.toy.trainer import TrainConfig, train

METRICS = ("accuracy", "exact_match", "reward", "response_length", "truncation_rate", "tokens_per_s")


def job(checkpoint: Path, dataset: Path, folder: Path, threads: int) -> JobSpec:
    return JobSpec(
        job_id=1,
        checkpoint_path=checkpoint,
        result_path=folder / "result.json",
        task=TaskSpec(
            name="arith",
            dataset=dataset,
            id_field="id",
            prompt_template=PROMPT_TEMPLATE,
            max_new_tokens=12,
            batch_size=100,
            metrics=METRICS,
        ),
        inference=InferenceSpec(engine="hf", threads=threads),
        max_samples=0,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=480, help="training steps of the tiny model")
    parser.add_argument("--problems", type=int, default=1000, help="held-out problems (at most 1000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="evald-bench-") as tmp:
        folder = Path(tmp)
        (checkpoint,) = train(TrainConfig(out=folder / "run", steps=args.steps, save_every=args.steps))
        dataset = folder / "heldout.jsonl"
        write_jsonl(held_out_problems(args.problems, seed=0), dataset)
        timings: list[Timing] = []
        walls: list[float] = []
        accuracy = 0.0
        spec = job(checkpoint, dataset, folder, args.threads)
        spec_path = folder / "spec.json"
        spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
        for _ in range(args.repeats):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "inference.worker", str(spec_path)], capture_output=True, text=True
            )
            walls.append(time.perf_counter() - started)
            if done.returncode != 0:
                raise SystemExit(f"the job failed ({done.returncode}): {done.stderr[-2000:]}")
            result = JobResult.read(spec.result_path)
            assert result.timing is not None
            timings.append(result.timing)
            accuracy = next(m.value for m in result.metrics if m.name == "accuracy")

    grading = statistics.median(t.grading_s for t in timings)
    wall = statistics.median(walls)
    evaluation = statistics.median(t.eval_s for t in timings)
    load = statistics.median(t.load_s for t in timings)
    print(f"tiny model after {args.steps} steps: accuracy {accuracy:.3f} on {args.problems} problems")
    print(
        f"job (median of {args.repeats}): {wall:.3f} s from spawn to exit; "
        f"model load {load:.3f} s, evaluation {evaluation:.3f} s"
    )
    print(f"grading: {grading:.3f} s, {args.problems / grading:.0f} samples/s")
    print(f"grading share of the job: {grading / wall:.1%} (target < 10%)")
    print(f"grading share of the evaluation (generation + grading + metrics): {grading / evaluation:.1%}")


if __name__ == "__main__":
    main()
