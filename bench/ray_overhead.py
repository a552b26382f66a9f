"""Ray executor overhead (issue 35): one job through Ray against the local executor, same checkpoint.

Per job, from the claim (submit) to the result stored in the database, the daemon's runner (JobRunner) in
this process, on a fresh SQLite database each time: ``local`` starts the worker process here, ``ray``
submits it as a Ray job to the tests' local cluster (tests/raycluster.py: a head and two worker nodes,
started if needed) and polls it every ``--poll-secs``. Printed: each repeat, the medians and the ratio
ray / local (local is the baseline, in the same process, alternating), for the whole job and for what
is outside the worker's own time (starting it, Ray's job supervisor and driver, the placement group,
polling, storing the result).

    python -m bench.ray_overhead [--repeats 3] [--poll-secs 0.5] [--checkpoint PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.slurm_overhead import config_text, timed_job, train_checkpoint
from daemon.config import Config, load_config
from inference.toy.problems import held_out_problems, write_jsonl
from tests.raycluster import RayCluster, ensure_cluster

EXECUTOR = """
[executor]
kind = "ray"
job_dir = "{job_dir}"
name_prefix = "bench{tag}"
time_limit = "10"
poll_secs = {poll}
# The daemon's start-up check of job_dir is one more job: not part of a job's overhead.
probe_job_dir = false

[executor.ray]
address = "{address}"
driver_python = "{python}"
env_vars = ["HF_HUB_OFFLINE"]
"""


def write_config(
    work: Path, checkpoint: Path, dataset: Path, kind: str, poll: float, cluster: RayCluster
) -> Config:
    text = config_text(work, checkpoint.parent, dataset)
    if kind == "ray":
        job_dir = work / "jobs"
        job_dir.mkdir(parents=True, exist_ok=True)
        text += EXECUTOR.format(
            job_dir=job_dir,
            tag=os.urandom(3).hex(),
            poll=poll,
            address=cluster.address,
            python=sys.executable,
        )
    path = work / "evald.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def one_job(
    work: Path, checkpoint: Path, dataset: Path, kind: str, poll: float, cluster: RayCluster
) -> tuple[float, float]:
    """Seconds from claim to the stored result, and of those the ones outside the worker's own time."""
    config = write_config(work, checkpoint, dataset, kind, poll, cluster)
    took, worker_s, _ = timed_job(config, checkpoint, work, kind)
    return took, took - worker_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--poll-secs", type=float, default=0.5)
    parser.add_argument("--checkpoint", type=Path, help="a toy checkpoint (default: train one, ~1 min)")
    args = parser.parse_args(argv)
    cluster = ensure_cluster()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="evald-ray-bench-") as tmp:
        work = Path(tmp)
        checkpoint = args.checkpoint or train_checkpoint(work)
        dataset = work / "heldout.jsonl"
        write_jsonl(held_out_problems(8, seed=1), dataset)
        times: dict[str, list[float]] = {"local": [], "ray": []}
        overheads: dict[str, list[float]] = {"local": [], "ray": []}
        for i in range(args.repeats):
            for kind in ("local", "ray"):
                folder = work / f"{kind}-{i}"
                folder.mkdir()
                took, overhead = one_job(folder, checkpoint, dataset, kind, args.poll_secs, cluster)
                times[kind].append(took)
                overheads[kind].append(overhead)
                print(
                    f"repeat {i + 1} {kind}: {took:.2f} s claim -> result stored "
                    f"(outside the worker {overhead:.2f} s)",
                    flush=True,
                )
        local, ray = statistics.median(times["local"]), statistics.median(times["ray"])
        print(
            f"per job, median of {args.repeats}: local {local:.2f} s, ray {ray:.2f} s "
            f"(poll_secs {args.poll_secs:g}): ratio {ray / local:.2f}x, overhead {ray - local:+.2f} s"
        )
        local_o, ray_o = statistics.median(overheads["local"]), statistics.median(overheads["ray"])
        print(
            f"overhead per job outside the worker's own time, median: local {local_o:.2f} s, "
            f"ray {ray_o:.2f} s: ratio {ray_o / local_o:.1f}x, {ray_o - local_o:+.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
