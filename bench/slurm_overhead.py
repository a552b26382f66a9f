"""Slurm executor overhead (issue 21): one job through Slurm against the local executor, same checkpoint.

Per job, from the claim (submit) to the result stored in the database, the daemon's runner (JobRunner) in
this process, on a fresh SQLite database each time: ``local`` starts the worker process here, ``slurm``
``sbatch``es it to the tests' one-host cluster (tests/slurmcluster.py, started if needed) and polls it
every ``--poll-secs`` (a success is taken from its folder's ``exit.json`` at the runner's next pass, so
the poll sets only how soon a failure or a state is seen). Printed: each repeat, the medians and the ratio
slurm / local (local is the baseline, in the same process, alternating), and for Slurm the queue wait and
run time Slurm reports.

Second figure: slurmctld stopped while a job runs, then started again, the runner's loop going on in a
thread as the daemon's does; the time from the controller answering again (``start_controller`` returns
once ``scontrol ping`` says UP) to the runner polling again (its ``executor.reachable``), in seconds, and
the longest pass of the loop while the controller was away (the Slurm tools wait for it on worker threads,
not in the pass).

    python -m bench.slurm_overhead [--repeats 3] [--poll-secs 0.5] [--checkpoint PATH]

Needs root (slurmd) and Debian's slurm-wlm + munge, like the tests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.toy_config import EVALUATED, toy_config
from daemon.config import Config, load_config
from daemon.running.runner import JobRunner
from inference.spec import JobResult
from inference.toy.problems import held_out_problems, write_jsonl
from storage import migrations, queries
from storage.database import Database
from storage.models import CheckpointState
from tests.slurmcluster import PARTITION, SlurmCluster, ensure_cluster

EXECUTOR = """
[executor]
kind = "slurm"
partition = "{partition}"
job_dir = "{job_dir}"
name_prefix = "bench"
time_limit = "10"
poll_secs = {poll}
# The daemon's start-up check of job_dir is one more job: not part of a job's overhead.
probe_job_dir = false
{extra}
"""


def train_checkpoint(work: Path) -> Path:
    out = work / "trained"
    subprocess.run(
        [
            *(sys.executable, "-m", "inference.toy.trainer", "--out", str(out), "--threads", "1"),
            *("--steps", "15", "--save-every", "15"),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return sorted(p for p in out.iterdir() if p.is_dir())[-1]


def config_text(work: Path, root: Path, dataset: Path) -> str:
    """The toy run's config on the local executor (an executor section goes after it)."""
    return toy_config(
        work / "e.db",
        root,
        dataset,
        work / "state",
        task=EVALUATED + "batch_size = 16\n",
        sections="[inference]\nthreads = 1\n",
        daemon='log_format = "json"\n',
    )


def write_config(
    work: Path, checkpoint: Path, dataset: Path, kind: str, poll: float, extra: str = ""
) -> Config:
    root = checkpoint.parent
    text = config_text(work, root, dataset)
    if kind == "slurm":
        job_dir = work / "jobs"
        job_dir.mkdir(parents=True, exist_ok=True)
        text += EXECUTOR.format(partition=PARTITION, job_dir=job_dir, poll=poll, extra=extra)
    path = work / "evald.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def enqueue(config: Config, checkpoint: Path) -> Database:
    database = Database(config.database.url)
    migrations.upgrade(database)
    with database.session() as session:
        run_id = queries.ensure_run(session, "toy", str(checkpoint.parent))
        checkpoint_id = queries.record_checkpoint(
            session,
            run_id=run_id,
            path=str(checkpoint),
            name=checkpoint.name,
            step=1,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(session, checkpoint_id=checkpoint_id, step=1, tasks=["arith"])
    return database


def timed_job(
    config: Config, checkpoint: Path, work: Path, kind: str
) -> tuple[float, float, queries.AttemptRow]:
    """Run the one queued job through ``config``'s executor: seconds from claim to the stored result, the
    worker's own seconds (start of its process to its result written) and the attempt's record."""
    database = enqueue(config, checkpoint)
    runner = JobRunner(config, database, f"bench:{os.getpid()}")
    began = time.monotonic()
    if not runner.claim_and_start():
        raise SystemExit(f"{kind}: nothing claimed")
    while runner.running or runner.unrecorded:
        runner.poll()
        time.sleep(0.02)
    took = time.monotonic() - began
    with database.session() as session:
        (row,) = queries.job_rows(session)
        if row.state != "succeeded":
            raise SystemExit(f"{kind}: job {row.state}: {row.error}")
        (attempt,) = queries.job_history(session, row.id)
    database.dispose()
    (result_path,) = work.glob("**/1-1/result.json")
    timing = JobResult.read(result_path).timing
    if timing is None:
        raise SystemExit(f"{kind}: the worker reported no timing")
    return took, timing.total_s, attempt


def one_job(
    work: Path, checkpoint: Path, dataset: Path, kind: str, poll: float
) -> tuple[float, dict[str, float]]:
    """Seconds from claim to the stored result; for Slurm, the queue wait and run time it reported."""
    config = write_config(work, checkpoint, dataset, kind, poll)
    took, worker_s, attempt = timed_job(config, checkpoint, work, kind)
    # What is not the worker's own time: starting it, the queue, watching it, storing the result.
    extra = {"worker_s": worker_s, "overhead_s": took - worker_s}
    if attempt.queue_wait_s is not None and attempt.run_s is not None:
        extra |= {"queue_wait_s": attempt.queue_wait_s, "run_s": attempt.run_s}
    return took, extra


def outage(
    work: Path, checkpoint: Path, dataset: Path, cluster: SlurmCluster, poll: float
) -> tuple[float, float]:
    """Seconds from slurmctld answering again to the runner polling again, with the runner's loop in a
    thread of its own (as the daemon's main loop, which goes on polling through the outage); and the
    longest one pass of that loop took while the controller was away (the loop is blocked that long)."""
    setup = work / "setup.sh"
    setup.write_text("while [ ! -e go ]; do sleep 0.2; done\n", encoding="utf-8")
    config = write_config(work, checkpoint, dataset, "slurm", poll, extra=f'setup_script = "{setup}"')
    database = enqueue(config, checkpoint)
    runner = JobRunner(config, database, f"bench:{os.getpid()}")
    runner.claim_and_start()
    ((_, running),) = runner.running.items()
    stop = threading.Event()
    passes: list[tuple[float, float]] = []

    def loop() -> None:
        while not stop.is_set():
            began = time.monotonic()
            runner.poll()
            passes.append((began, time.monotonic() - began))
            time.sleep(0.02)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        while not running.state or not running.state.startswith("RUNNING"):
            time.sleep(0.05)
        cluster.stop_controller()
        down = time.monotonic()
        while runner.executor_unusable is None:
            time.sleep(0.02)
        time.sleep(3 * poll)
        cluster.start_controller()
        back = time.monotonic()
        while runner.executor_unusable is not None:
            time.sleep(0.01)
        polling = time.monotonic() - back
        longest = max(took for began, took in passes if down <= began <= back)
        assert running.handle is not None
        (running.handle.job_dir / "go").touch()
        while runner.running or runner.unrecorded:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join()
        if not cluster.controller_answers():
            cluster.start_controller()
    database.dispose()
    return polling, longest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--poll-secs", type=float, default=0.5)
    parser.add_argument("--checkpoint", type=Path, help="a toy checkpoint (default: train one, ~1 min)")
    args = parser.parse_args(argv)
    cluster = ensure_cluster()
    os.environ.update(cluster.env)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="evald-slurm-bench-") as tmp:
        work = Path(tmp)
        checkpoint = args.checkpoint or train_checkpoint(work)
        dataset = work / "heldout.jsonl"
        write_jsonl(held_out_problems(8, seed=1), dataset)
        times: dict[str, list[float]] = {"local": [], "slurm": []}
        overheads: dict[str, list[float]] = {"local": [], "slurm": []}
        slurm_parts: list[dict[str, float]] = []
        for i in range(args.repeats):
            for kind in ("local", "slurm"):
                folder = work / f"{kind}-{i}"
                folder.mkdir()
                took, extra = one_job(folder, checkpoint, dataset, kind, args.poll_secs)
                times[kind].append(took)
                overheads[kind].append(extra["overhead_s"])
                if "queue_wait_s" in extra:
                    slurm_parts.append(extra)
                shown = ", ".join(f"{k} {v:.2f}" for k, v in extra.items())
                print(f"repeat {i + 1} {kind}: {took:.2f} s claim -> result stored ({shown})", flush=True)
        local, slurm = statistics.median(times["local"]), statistics.median(times["slurm"])
        print(
            f"per job, median of {args.repeats}: local {local:.2f} s, slurm {slurm:.2f} s "
            f"(poll_secs {args.poll_secs:g}): ratio {slurm / local:.2f}x, overhead {slurm - local:+.2f} s"
        )
        local_o, slurm_o = statistics.median(overheads["local"]), statistics.median(overheads["slurm"])
        print(
            f"overhead per job outside the worker's own time, median: local {local_o:.2f} s, "
            f"slurm {slurm_o:.2f} s: ratio {slurm_o / local_o:.1f}x, {slurm_o - local_o:+.2f} s"
        )
        if slurm_parts:
            waits = statistics.median(p["queue_wait_s"] for p in slurm_parts)
            runs = statistics.median(p["run_s"] for p in slurm_parts)
            print(f"slurm's own record, median: queue wait {waits:.0f} s, run {runs:.0f} s (whole seconds)")
        backs, blocked = [], []
        for i in range(args.repeats):
            folder = work / f"outage-{i}"
            folder.mkdir()
            back, longest = outage(folder, checkpoint, dataset, cluster, args.poll_secs)
            backs.append(back)
            blocked.append(longest)
            print(
                f"outage {i + 1}: polling again {back:.2f} s after slurmctld answered; "
                f"longest pass while it was away {longest:.2f} s",
                flush=True,
            )
        print(
            f"slurmctld back -> daemon polling again: median {statistics.median(backs):.2f} s, "
            f"max {max(backs):.2f} s (poll_secs {args.poll_secs:g}); longest loop pass during the outage "
            f"{max(blocked):.2f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
