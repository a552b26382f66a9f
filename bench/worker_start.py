"""Worker start: a small DeepSpeed-engine job from spawn to exit, with mlflow kept out and without.

Each job runs as the daemon runs it (``python -m inference.worker SPEC``, engine ``deepspeed``, the
default), on a tiny model trained on the spot and a few problems, so the job is mostly the worker's start:
importing torch, transformers and DeepSpeed, and loading the model. Both run the worker's ``main`` as
``python -m inference.worker`` does; the baseline turns ``skip_mlflow`` off, where ``import deepspeed``
imports mlflow (installed beside evald for the trackers) through DeepSpeed's autotuner. Alternating in
one process, ``--repeats`` times each; wall time and CPU time (the child's user + system) are medians.

    python -m bench.worker_start [--repeats 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import grading_share
from inference.spec import JobResult, JobSpec
from inference.toy.problems import held_out_problems, write_jsonl
from inference.toy.trainer import TrainConfig, train

#: What ``python -m inference.worker SPEC`` runs (main, then ``os._exit``), with the skip on or off.
WORKER = (
    "import os, sys\n"
    "import inference.worker as w\n"
    "{off}"
    "code = w.main([{spec!r}])\n"
    "sys.stdout.flush(); sys.stderr.flush(); os._exit(code)\n"
)


def job(checkpoint: Path, dataset: Path, folder: Path) -> JobSpec:
    """grading_share's job on the default engine, one thread."""
    spec = grading_share.job(checkpoint, dataset, folder, threads=1)
    return spec.model_copy(update={"inference": spec.inference.model_copy(update={"engine": "deepspeed"})})


def timed(command: list[str], spec: JobSpec) -> tuple[float, float]:
    """Wall and CPU seconds of one worker run; the run must succeed with a result."""
    spec.result_path.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the job failed ({done.returncode}): {done.stderr[-2000:]}")
    if JobResult.read(spec.result_path).error is not None:
        raise SystemExit(f"the job reported an error: {JobResult.read(spec.result_path).error}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def toy_job(folder: Path) -> Path:
    """The benchmarks' toy job in ``folder``: a model trained on the spot, 20 problems; its spec's path."""
    (checkpoint,) = train(TrainConfig(out=folder / "run", steps=40, save_every=40))
    dataset = folder / "problems.jsonl"
    write_jsonl(held_out_problems(20, seed=0), dataset)
    spec_path = folder / "spec.json"
    spec_path.write_text(job(checkpoint, dataset, folder).model_dump_json(), encoding="utf-8")
    return spec_path


def report(runs: dict[str, list[tuple[float, float]]], repeats: int) -> dict[str, tuple[float, float]]:
    """Print each case's median wall and CPU seconds; return them by case, in order."""
    medians = {
        name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
        for name, r in runs.items()
    }
    for name, (wall, cpu) in medians.items():
        print(f"{name}: {wall:.2f} s from spawn to exit, {cpu:.2f} s CPU (median of {repeats})")
    return medians


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="evald-bench-") as tmp:
        folder = Path(tmp)
        spec_path = toy_job(folder)
        spec = JobSpec.model_validate_json(spec_path.read_bytes())
        off = "w.skip_mlflow = lambda: None\n"
        commands = {
            "mlflow kept out": [sys.executable, "-c", WORKER.format(off="", spec=str(spec_path))],
            "baseline (mlflow imported)": [sys.executable, "-c", WORKER.format(off=off, spec=str(spec_path))],
        }
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.repeats):
            for name, command in commands.items():
                runs[name].append(timed(command, spec))

    (ours_wall, ours_cpu), (base_wall, base_cpu) = report(runs, args.repeats).values()
    print(f"ratio baseline / ours: wall {base_wall / ours_wall:.2f}, CPU {base_cpu / ours_cpu:.2f}")


if __name__ == "__main__":
    main()
