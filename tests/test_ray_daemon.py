"""The daemon with ``[executor] kind = "ray"`` against the tests' local Ray cluster (tests/raycluster.py).

A real daemon process evaluates the toy checkpoints through Ray jobs; submissions are counted with Ray's
state API (``list_jobs``, by the config's name prefix). A job that must stay pending asks for
``evald_worker``, which a blocker job holds on both worker nodes until the test releases it; one that
must stay running has ranks whose interpreter waits for a file ``go`` in the job folder before it
starts the real worker. The figures these scenarios stand for are ``long``.
"""

from __future__ import annotations

import json
import signal
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage import queries
from storage.database import Database
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    jobs,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.raycluster import RayCluster, ray_cluster

__all__ = ["ray_cluster"]

#: Metrics that are the same wherever the worker runs (the timings are not).
STABLE = ("accuracy", "response_length", "truncation_rate")
WAIT_S = 300.0

#: Holds ``evald_worker`` on both worker nodes until the file named by its argument exists.
BLOCKER = """\
import os, sys, time, ray
ray.init()
group = ray.util.placement_group([{"evald_worker": 1}] * 2, strategy="STRICT_SPREAD")
ray.get(group.ready())
open(sys.argv[1] + ".held", "w").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.2)
"""


@dataclass(frozen=True)
class RayDaemon:
    config: Path
    job_dir: Path
    prefix: str
    cluster: RayCluster

    def submissions(self) -> list[str]:
        """The evaluation jobs Ray holds for this config, from Ray's state API (probes left out)."""
        from ray.util.state import list_jobs

        return sorted(
            j.submission_id
            for j in list_jobs(address=self.cluster.dashboard, detail=True, limit=10000)
            if (j.metadata or {}).get("evald") == self.prefix and "probe" not in (j.metadata or {})
        )

    def stop_all(self) -> None:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(self.cluster.dashboard)
        for job in client.list_jobs():
            if (job.metadata or {}).get("evald") == self.prefix and not job.status.is_terminal():
                client.stop_job(str(job.submission_id))


def ray_config(
    tmp: Path,
    url: str,
    cluster: RayCluster,
    *,
    dataset: Path,
    executor_extra: str = "",
    ray_extra: str = "",
    run_extra: str = "",
) -> RayDaemon:
    job_dir = tmp / "ray-jobs"
    job_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"t{uuid.uuid4().hex[:8]}"
    path = write_config(tmp, url, dataset=dataset, run_extra=run_extra)
    section = f"""
[executor]
kind = "ray"
job_dir = "{job_dir}"
name_prefix = "{prefix}"
time_limit = "5"
poll_secs = 0.5
{executor_extra}

[executor.ray]
address = "{cluster.address}"
driver_python = "{sys.executable}"
env_vars = ["HF_HUB_OFFLINE"]
{ray_extra}
"""
    path.write_text(path.read_text(encoding="utf-8") + section, encoding="utf-8")
    return RayDaemon(path, job_dir, prefix, cluster)


def _events(log: Path) -> list[dict[str, object]]:
    out = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def _count(log: Path) -> Counter[str]:
    return Counter(str(e.get("event", "")) for e in _events(log))


def _states(log: Path) -> list[str]:
    """The last scheduler state the daemon logged for each job, in job order."""
    last: dict[int, str] = {}
    for event in _events(log):
        if event.get("event") == "job.scheduler_state":
            last[int(str(event["job_id"]))] = str(event["state"])
    return [last[k] for k in sorted(last)]


def _gate(folder: Path) -> Path:
    """An interpreter for the ranks that waits for ``go`` in its job folder, then runs the real one."""
    script = folder / "python-gated"
    script.write_text(f'#!/bin/sh\nwhile [ ! -e go ]; do sleep 0.2; done\nexec {sys.executable} "$@"\n')
    script.chmod(0o755)
    return script


def _go(daemon: RayDaemon) -> None:
    for folder in daemon.job_dir.iterdir():
        if folder.is_dir() and not folder.name.startswith("."):
            (folder / "go").touch()


def _stable_results(database: Database) -> dict[tuple[str, str], float]:
    with database.session() as session:
        rows = queries.result_rows(session)
    return {(r.checkpoint, r.metric): r.value for r in rows if r.metric in STABLE}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ray-daemon-data") / "arith.jsonl", 8)


@pytest.mark.long
def test_toy_checkpoints_through_ray_equal_the_local_executors_results(
    ray_cluster: RayCluster, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    results = {}
    for kind in ("local", "ray"):
        folder = tmp_path / kind
        folder.mkdir()
        url = f"sqlite:///{folder / 'evald.sqlite'}"
        database = upgraded(url)
        # Succeeded jobs' folders removed at the next clean-up (as Slurm's are).
        daemon = (
            ray_config(folder, url, ray_cluster, dataset=dataset, executor_extra="keep_job_dirs_secs = 0")
            if kind == "ray"
            else None
        )
        config = daemon.config if daemon is not None else write_config(folder, url, dataset=dataset)
        for step in (10, 20):
            copy_checkpoint(toy_run.last_checkpoint, folder / "run" / f"step_{step}")
        with running_daemon(config, folder / "daemon.log", {"HF_HUB_OFFLINE": "1"}) as process:
            wait_for(lambda: all_jobs_done(database, 2), WAIT_S, "both jobs", process.process)  # noqa: B023
            if daemon is not None:
                job_dir = daemon.job_dir
                wait_for(
                    lambda: not any(job_dir.iterdir()) or None,  # noqa: B023
                    60,
                    "the succeeded jobs' folders removed",
                    process.process,
                )
            assert process.stop() == 0
        assert [j.state for j in jobs(database)] == ["succeeded", "succeeded"]
        results[kind] = _stable_results(database)
        if daemon is not None:
            assert len(daemon.submissions()) == 2
            # The probe's task read back what the daemon wrote into job_dir: the nodes see the folder.
            assert _count(folder / "daemon.log")["executor.job_dir_shared"] == 1
            assert _count(folder / "daemon.log")["ray.job_dirs_removed"] >= 1
        database.dispose()
    assert results["ray"] == results["local"] and len(results["local"]) == 2 * len(STABLE)


@pytest.mark.long
def test_kill_9_while_pending_and_while_running_reattaches_without_a_second_submission(
    ray_cluster: RayCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    database = upgraded(sqlite_url)
    gated = _gate(tmp_path)
    daemon = ray_config(
        tmp_path,
        sqlite_url,
        ray_cluster,
        dataset=dataset,
        executor_extra=f'python = "{gated}"\nprobe_job_dir = false',
        ray_extra='resources = { "evald_worker" = 1 }',
    )
    release = tmp_path / "release"
    client = JobSubmissionClient(ray_cluster.dashboard)
    blocker = client.submit_job(entrypoint=f"{sys.executable} -c '{BLOCKER}' {release}")
    env = {"HF_HUB_OFFLINE": "1"}
    try:
        wait_for(lambda: Path(f"{release}.held").exists() or None, 120, "the blocker to hold the workers")
        for step in (10, 20):
            copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / f"step_{step}")
        first = DaemonProcess(daemon.config, tmp_path / "daemon-1.log", env)
        first.wait_ready()

        def pending() -> bool | None:
            states = _states(first.log)
            return (
                len(states) == 2 and all(s.startswith("PENDING (waiting for resources") for s in states)
            ) or None

        wait_for(pending, 120, "two jobs waiting for resources", first.process)
        # Killed while both wait for their bundles: the next daemon re-attaches to them.
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        second = DaemonProcess(daemon.config, tmp_path / "daemon-2.log", env)
        second.wait_ready()
        wait_for(lambda: _count(second.log)["job.reattached"] == 2 or None, 60, "re-attached", second.process)
        release.touch()

        def running() -> bool | None:
            states = _states(second.log)
            return (len(states) == 2 and all(s.startswith("RUNNING") for s in states)) or None

        wait_for(running, 120, "both running", second.process)
        # Killed while both run (their ranks wait for `go`): the third re-attaches again.
        assert second.stop(signal.SIGKILL) == -signal.SIGKILL
        with running_daemon(daemon.config, tmp_path / "daemon-3.log", env) as third:
            wait_for(
                lambda: _count(third.log)["job.reattached"] == 2 or None, 60, "re-attached", third.process
            )
            _go(daemon)
            rows = wait_for(lambda: all_jobs_done(database, 2), WAIT_S, "both stored", third.process)
            assert third.stop() == 0
    finally:
        release.touch()
        daemon.stop_all()
        client.stop_job(blocker)
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 1), ("succeeded", 1)]
    assert len(daemon.submissions()) == 2
    with database.session() as session:
        counts = Counter(r.checkpoint for r in queries.result_rows(session))
    assert set(counts) == {"step_10", "step_20"} and len(set(counts.values())) == 1
    database.dispose()
