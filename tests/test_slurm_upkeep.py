"""What the Slurm executor leaves under ``job_dir``: ended jobs' folders removed after their retention (a
failed job's kept longer, a running job's never), and a dead daemon's held probe cancelled by the next
daemon's probe (on the tests' real cluster), while a live daemon's and another user's are left alone."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from daemon.running.executors import job_dirs, slurm_upkeep
from daemon.running.executors.slurm_output import SlurmJob
from daemon.running.executors.slurm_script import EXIT_NAME, probe_script
from inference.spec import JobResult
from tests.deadlines import Deadline, patient
from tests.slurmcluster import SlurmCluster, slurm_cluster
from tests.test_slurm_executor import make_executor

__all__ = ["slurm_cluster"]

HOUR = 3600.0


def _folder(root: Path, name: str, *, exit_code: int | None, result: bool, age_s: float) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text("{}", encoding="utf-8")
    if result:
        JobResult(job_id=int(name.split("-")[0])).write(folder / "result.json")
    if exit_code is not None:
        (folder / EXIT_NAME).write_text(json.dumps({"exit_code": exit_code}), encoding="utf-8")
    then = time.time() - age_s
    for path in [*folder.iterdir(), folder]:
        os.utime(path, (then, then))
    return folder


def test_ended_job_folders_go_after_their_retention_failed_ones_later_and_busy_ones_never(
    tmp_path: Path,
) -> None:
    root = tmp_path / "jobs"
    ok_old = _folder(root, "1-1", exit_code=0, result=True, age_s=2 * HOUR)
    ok_new = _folder(root, "2-1", exit_code=0, result=True, age_s=60)
    failed_old = _folder(root, "3-1", exit_code=1, result=False, age_s=2 * HOUR)
    failed_older = _folder(root, "4-2-batch8", exit_code=4, result=False, age_s=30 * HOUR)
    running = _folder(root, "5-1", exit_code=None, result=False, age_s=30 * HOUR)
    cancelled_queued = _folder(root, "6-1", exit_code=None, result=False, age_s=30 * HOUR)
    just_made = _folder(root, "7-1", exit_code=None, result=False, age_s=1)
    probe = _folder(root, ".probe-abc", exit_code=None, result=False, age_s=30 * HOUR)
    live_probe = _folder(root, ".probe-live", exit_code=None, result=False, age_s=30 * HOUR)
    other = _folder(root, "notes", exit_code=0, result=False, age_s=30 * HOUR)
    refusal = root / ".refused-evald.json"
    refusal.write_text("{}", encoding="utf-8")

    removed = job_dirs.sweep(root, busy={5}, keep=[live_probe], keep_ok_secs=HOUR, keep_failed_secs=24 * HOUR)

    assert sorted(removed) == sorted([ok_old, failed_older, cancelled_queued, probe])
    for kept in (ok_new, failed_old, running, just_made, live_probe, other, refusal):
        assert kept.exists(), kept
    # A retention of 0 removes a succeeded job's folder at once, but not one just made for a submission.
    again = job_dirs.sweep(root, busy={5}, keep=[live_probe], keep_ok_secs=0, keep_failed_secs=24 * HOUR)
    assert again == [ok_new] and just_made.exists()
    # A job_dir that is not there is nothing to clean.
    assert job_dirs.sweep(tmp_path / "none", busy=set(), keep_ok_secs=0, keep_failed_secs=0) == []


def _probe_job(prefix: str, comment: str, submitted: float, state: str = "PENDING") -> SlurmJob:
    return SlurmJob("7", f"{prefix}-probe", state, comment=comment, submit_time=submitted)


def test_which_probes_are_a_dead_daemons() -> None:
    now = time.time()
    host, uid = socket.gethostname(), os.getuid()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead_here = _probe_job("ev", f"ev:probe:uid={uid}:owner={host}:{gone.pid}", now - 60)
    mine = _probe_job("ev", slurm_upkeep.probe_comment("ev"), now - 60)
    alive_here = _probe_job("ev", f"ev:probe:uid={uid}:owner={host}:{os.getppid()}", now - 60)
    elsewhere_new = _probe_job("ev", f"ev:probe:uid={uid}:owner=node9:12", now - 60)
    elsewhere_old = _probe_job("ev", f"ev:probe:uid={uid}:owner=node9:12", now - 7 * HOUR)
    someone_elses = _probe_job("ev", f"ev:probe:uid={uid + 1}:owner={host}:{gone.pid}", now - 60)
    other_prefix = _probe_job("xx", f"xx:probe:uid={uid}:owner={host}:{gone.pid}", now - 60)
    ended = _probe_job("ev", f"ev:probe:uid={uid}:owner={host}:{gone.pid}", now - 60, "CANCELLED")
    queue = [dead_here, mine, alive_here, elsewhere_new, elsewhere_old, someone_elses, other_prefix, ended]

    assert slurm_upkeep.stale_probes(queue, "ev", now) == [dead_here, elsewhere_old]


def _states(cluster: SlurmCluster, ids: list[str]) -> dict[str, str]:
    done = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T"],
        capture_output=True,
        text=True,
        env=cluster.client_env(),
        timeout=patient(60),
        check=True,
    )
    return dict(line.split("|", 1) for line in done.stdout.split())


@pytest.mark.slow
def test_a_dead_daemons_held_probe_is_cancelled_by_the_next_probe(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    executor = make_executor(slurm_cluster, tmp_path / "jobs", extra_sbatch=["--hold"])
    prefix, uid, host = executor.config.name_prefix, os.getuid(), socket.gethostname()
    gone = subprocess.Popen(["true"])
    gone.wait()
    submitted = []
    try:
        for name, owner_uid in (("dead", uid), ("someone", uid + 1)):
            folder = executor.job_dir / f".probe-{name}"
            folder.mkdir()
            comment = f"{prefix}:probe:uid={owner_uid}:owner={host}:{gone.pid}"
            (folder / "probe.sbatch").write_text(probe_script(executor.config, folder, comment))
            submitted.append(executor.cli.submit(folder / "probe.sbatch"))
        dead, someone = submitted

        probe = executor.probe_job_dir()
        submitted.append(probe.external_id)

        states = _states(slurm_cluster, submitted)
        assert states[dead] == "CANCELLED"
        assert states[someone] == "PENDING" and states[probe.external_id] == "PENDING"
        # Cancelled from outside before it could tell, this daemon's probe gives no verdict (False).
        executor.cli.cancel(probe.external_id)
        deadline = Deadline(30)
        while (answer := executor.probe_result(probe)) is None and not deadline.expired():
            time.sleep(0.2)
        assert answer is False and not probe.job_dir.exists()
    finally:
        for job_id in submitted:
            executor.cli.cancel(job_id)
