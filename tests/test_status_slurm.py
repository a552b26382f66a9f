"""``evald status`` on jobs a real daemon handed to the tests' one-host Slurm cluster (tests/slurmcluster.py)
and that Slurm holds (submitted ``--hold``): counted as pending in Slurm, not as running, with Slurm's
reason and each one's wait so far; and the job ``max_queued_per_run`` keeps in evald's queue, with why
(issue 32). Skipped where no cluster answers unless ``EVALD_REQUIRE_SLURM=1``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import evald, running_daemon, upgraded, wait_for, write_dataset
from tests.slurmcluster import SlurmCluster, slurm_cluster
from tests.slurmdaemon import slurm_config

__all__ = ["slurm_cluster"]

STEPS = (10, 20, 30)
#: Jobs of the run let into Slurm at once: the third waits in evald's queue.
PER_RUN = 2


def test_jobs_held_in_slurms_queue_are_pending_there_with_their_wait(
    slurm_cluster: SlurmCluster, sqlite_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    upgraded(sqlite_url).dispose()
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=write_dataset(tmp_path / "arith.jsonl", 4),
        executor_extra=f'extra_sbatch = ["--hold"]\nmax_queued_per_run = {PER_RUN}',
    )
    for step in STEPS:
        copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / f"step_{step}")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            submitted = wait_for(
                lambda: len(daemon.queue()) == PER_RUN or None, 60, "two jobs in Slurm", process.process
            )
            assert submitted

            def status() -> dict[str, Any] | None:
                done = evald("--config", str(daemon.config), "status", "--format", "json", env=daemon.env)
                assert done.returncode == 0, done.stderr
                shown: dict[str, Any] = json.loads(done.stdout)["runs"]["toy"]
                slurm = shown.get("slurm")
                # The dispatcher stores Slurm's state at its next poll after the submission, and the
                # hold on the third job at its next claim.
                in_slurm = slurm == {
                    "pending": 2,
                    "running": 0,
                    "unknown": 0,
                    "reasons": {"JobHeldUser": 2},
                    "executor": "slurm",
                }
                return shown if in_slurm and shown.get("held") else None

            shown = wait_for(status, 60, "two jobs held in Slurm, one in evald's queue", process.process)
            (third,) = shown["held"]
            assert third["reason"] == f"held: max_queued_per_run {PER_RUN} reached for run 'toy'", third
            ids = sorted(j["id"] for j in daemon.queue())
            running = shown["running"]
            assert sorted(j["slurm_job_id"] for j in running) == ids
            assert {(j["in_slurm"], j["scheduler_state"]) for j in running} == {
                ("pending", "PENDING (JobHeldUser)")
            }
            assert all(j["queue_wait_s"] is not None and j["queue_wait_s"] >= 0 for j in running)
            text = evald("--config", str(daemon.config), "status", env=daemon.env).stdout
            assert "pending in Slurm 2 (JobHeldUser), running 0" in text, text
            waiting = [line for line in text.splitlines() if line.startswith("  in Slurm:")]
            assert len(waiting) == 2 and all(
                re.search(r"Slurm job \d+ PENDING \(JobHeldUser\), waiting \d+s", line) for line in waiting
            ), waiting
            assert "  running:" not in text
            line = f"  held:        1 job(s), step(s) {third['step']}: max_queued_per_run {PER_RUN} reached"
            assert line in text, text
    finally:
        daemon.cancel_all()
