"""Restart reconciliation: a daemon starting over 100 runs × 100 existing checkpoints.

Half the checkpoints of every run were evaluated before the restart (ready, with a succeeded job in the
database); the other half are new. Measured: the time from starting ``evald run`` until every one of the
10,000 checkpoints is registered in the database, and the jobs created for the evaluated half (must be
zero). The quiet period is set long so the new half stays ``discovered`` while it is measured. The
baseline, in the same process, is a plain ``os.scandir`` walk that stats every file of every checkpoint:
the filesystem work no daemon can avoid.

    python -m bench.reconciliation [--runs 100] [--per-run 100]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import func, select

from storage import migrations, queries, scheduling
from storage.database import Database
from storage.models import Checkpoint, CheckpointState, EvalJob, Plan, utcnow

CONFIG_HEAD = """\
[database]
url = "sqlite:///{db}"

[[tasks]]
name = "arith"
dataset = "{dataset}"

[inference]
python = "/bin/true"

[scheduling]
quiet_secs = 600.0
rescan_secs = 600.0

[daemon]
state_dir = "{state}"
log_format = "json"
"""


def _safetensors() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(16)


def build(work: Path, runs: int, per_run: int) -> tuple[Path, Database]:
    weights = _safetensors()
    config = '{"model_type": "llama"}'
    lines = [CONFIG_HEAD.format(db=work / "e.db", dataset=work / "d.jsonl", state=work / "state")]
    (work / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    database = Database(f"sqlite:///{work / 'e.db'}")
    migrations.upgrade(database)
    for r in range(runs):
        root = work / "runs" / f"run{r:03d}"
        lines.append(f'[[runs]]\nname = "run{r:03d}"\nroot = "{root}"\nlayout = "hf"\n')
        with database.session() as session:
            run_id = queries.ensure_run(session, f"run{r:03d}", str(root))
            now = utcnow()
            scheduling.ensure_schedule(session, run_id, now)
            for c in range(per_run):
                folder = root / f"step_{(c + 1) * 10}"
                folder.mkdir(parents=True)
                (folder / "config.json").write_text(config)
                (folder / "model.safetensors").write_bytes(weights)
                if c % 2 == 0:
                    checkpoint_id = queries.record_checkpoint(
                        session,
                        run_id=run_id,
                        path=str(folder),
                        name=folder.name,
                        step=(c + 1) * 10,
                        epoch=None,
                        layout="hf",
                        state=CheckpointState.READY,
                    )
                    scheduling.set_plan(session, checkpoint_id, Plan.DUE, "evaluated before the restart", now)
                    queries.enqueue_jobs(
                        session, checkpoint_id=checkpoint_id, step=(c + 1) * 10, tasks=["arith"]
                    )
        with database.session() as session:
            while (job := queries.claim_next_job(session, "before:1")) is not None:
                queries.complete_job(
                    session,
                    job_id=job.id,
                    owner="before:1",
                    metrics=[],
                    samples=[],
                    duration_s=1.0,
                    load_s=None,
                )
    path = work / "evald.toml"
    path.write_text("\n".join(lines))
    return path, database


def raw_walk(root: Path) -> int:
    files = 0
    for run in os.scandir(root):
        for checkpoint in os.scandir(run.path):
            for entry in os.scandir(checkpoint.path):
                entry.stat()
                files += 1
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--per-run", type=int, default=100)
    args = parser.parse_args()
    total = args.runs * args.per_run
    with tempfile.TemporaryDirectory(prefix="evald-reconcile-") as tmp:
        work = Path(tmp)
        config, database = build(work, args.runs, args.per_run)
        with database.session() as session:
            jobs_before = session.scalar(select(func.count(EvalJob.id))) or 0
        started = time.perf_counter()
        walked = raw_walk(work / "runs")
        baseline = time.perf_counter() - started
        log = (work / "daemon.log").open("wb")
        started = time.perf_counter()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "daemon", "--config", str(config), "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while True:
                with database.session() as session:
                    registered = session.scalar(select(func.count(Checkpoint.id))) or 0
                if registered >= total:
                    break
                if daemon.poll() is not None:
                    raise RuntimeError(f"daemon exited; see {work / 'daemon.log'}")
                time.sleep(0.05)
            elapsed = time.perf_counter() - started
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
            log.close()
        with database.session() as session:
            jobs_after = session.scalar(select(func.count(EvalJob.id))) or 0
        database.dispose()
    print(f"{args.runs} runs x {args.per_run} checkpoints ({total // 2} evaluated before the restart)")
    print(f"daemon start to all {total} registered: {elapsed:.2f} s (target < 5 s)")
    print(f"baseline raw walk of {walked} files: {baseline:.3f} s; ratio {elapsed / baseline:.1f}x")
    print(f"jobs created for already-evaluated checkpoints: {jobs_after - jobs_before}")


if __name__ == "__main__":
    main()
