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
from typing import Any

import pytest

from storage import queries
from storage.database import Database
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    all_log_events,
    evald,
    jobs,
    running_daemon,
    upgraded,
    wait_for,
    worker_processes,
    write_config,
    write_dataset,
)
from tests.mlflowserver import Gate
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
    address: str | None = None,
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
address = "{address or cluster.address}"
driver_python = "{sys.executable}"
env_vars = ["HF_HUB_OFFLINE"]
{ray_extra}
"""
    path.write_text(path.read_text(encoding="utf-8") + section, encoding="utf-8")
    return RayDaemon(path, job_dir, prefix, cluster)


def _count(log: Path) -> Counter[str]:
    return Counter(str(e.get("event", "")) for e in all_log_events(log))


def _states(log: Path) -> list[str]:
    """The last scheduler state the daemon logged for each job, in job order."""
    last: dict[int, str] = {}
    for event in all_log_events(log):
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


def _status(daemon: RayDaemon, *extra: str) -> str:
    done = evald("--config", str(daemon.config), "status", *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _node_of_rank(daemon: RayDaemon, folder: str) -> str | None:
    """The node of a running rank as Ray's state API names it (``a (192.0.2.2)``), once its log's first
    line says where it runs."""
    from ray.util.state import list_nodes

    log = daemon.job_dir / folder / "worker.log"
    line = log.read_text(errors="replace") if log.exists() else ""
    if "on Ray node " not in line:
        return None
    node_id = line.split("on Ray node ", 1)[1].split(" ", 1)[0]
    (node,) = [n for n in list_nodes(address=daemon.cluster.dashboard, detail=True) if n.node_id == node_id]
    return f"{node.node_name} ({node.node_ip})"


def _lose(daemon: RayDaemon, name: str, folder: Path) -> None:
    """What a head restart does to a job: Ray forgets it, and its folder holds no end (its driver died)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(daemon.cluster.dashboard)
    client.stop_job(name)
    # Stopped, its driver writes its end (unless Ray killed it first): once the driver is gone, the end
    # is removed with Ray's record of the job.
    wait_for(lambda: client.get_job_status(name).is_terminal() or None, 60, "the job stopped")
    driver = str(folder / "ray_driver.py")
    wait_for(
        lambda: not [p for p in worker_processes(folder) if driver in p.info["cmdline"]] or None,
        60,
        "its driver gone",
    )
    (folder / "exit.json").unlink(missing_ok=True)
    client.delete_job(name)


@pytest.mark.long
def test_a_head_cut_off_shows_unreachable_its_job_unknown_and_the_lost_job_resubmitted(
    ray_cluster: RayCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    """The daemon reaches Ray's dashboard through a loopback gate, closed mid-job: ``evald status`` says
    the head has not answered since when (claiming paused) and the job's state unknown since when, its
    last state named, not RUNNING; the head forgets the job meanwhile; the gate opened, the job is lost
    and its next attempt logged ``job.resubmitted``, never ``job.reattached``; every line names the Ray
    job under ``ray_job``, never ``slurm_job_id``."""
    database = upgraded(sqlite_url)
    gate = Gate(ray_cluster.dashboard_port)
    daemon = ray_config(
        tmp_path,
        sqlite_url,
        ray_cluster,
        dataset=dataset,
        executor_extra=f'python = "{_gate(tmp_path)}"\nprobe_job_dir = false',
        address=gate.uri,
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    first, second = f"{daemon.prefix}-1-1", f"{daemon.prefix}-1-2"
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", {"HF_HUB_OFFLINE": "1"}) as process:
            node = wait_for(lambda: _node_of_rank(daemon, "1-1"), 120, "the rank running", process.process)
            wait_for(lambda: (_states(process.log) or [""])[0].startswith("RUNNING") or None, 60, "running")
            assert _states(process.log) == [f"RUNNING on {node}"]
            assert f"ray:       job {first}: RUNNING on {node}" in _status(daemon)

            gate.close()
            wait_for(lambda: _count(process.log)["executor.unreachable"] or None, 60, "unreachable")

            def away() -> dict[str, Any] | None:
                shown = json.loads(_status(daemon, "--format", "json"))
                (job,) = shown["runs"]["toy"]["running"]
                return shown if job.get("in_slurm") == "unknown" else None

            shown = wait_for(away, 60, "the job's state unknown", process.process)
            text = _status(daemon)
            _lose(daemon, first, daemon.job_dir / "1-1")
            gate.open()
            wait_for(lambda: _count(process.log)["job.resubmitted"] or None, 120, "a resubmission")
            wait_for(lambda: "executor:" not in _status(daemon) or None, 60, "the outage over in status")
            assert process.stop() == 0
    finally:
        gate.close()
        daemon.stop_all()

    what = f"the Ray head at {gate.uri}"
    executor = shown["executor"]
    assert (executor["reachable"], executor["what"], executor["claiming"]) == (False, what, "paused")
    (job,) = shown["runs"]["toy"]["running"]
    assert (job["slurm_job_id"], job["executor"]) == (first, "ray")
    assert job["reason"] == f"{what} does not answer; last RUNNING on {node}"
    assert job["scheduler_state"] == f"UNKNOWN since {job['unknown_since'][:19]}Z ({job['reason']})"
    stamp = executor["since"][:19]
    assert f"executor: unreachable since {stamp}Z" in text and "claiming paused" in text, text
    assert "  jobs:        state unknown 1 (Ray does not answer), running 0" in text, text
    assert f"Ray job {first} state unknown since {job['unknown_since'][:19]}Z" in text
    assert "  running:" not in text

    events = all_log_events(tmp_path / "daemon.log")
    named = [e for e in events if e.get("ray_job") or e.get("slurm_job_id")]
    assert named and all("slurm_job_id" not in e for e in named), named
    said = [
        (e["event"], e.get("attempt"), e.get("ray_job")) for e in events if str(e["event"]).startswith("job.")
    ]
    assert ("job.submitted", 1, first) in said and ("job.resubmitted", 2, second) in said, said
    assert "job.reattached" not in [e for e, _, _ in said]
    with database.session() as session:
        (row,) = queries.job_rows(session)
        history = queries.job_history(session, row.id)
    assert [(a.attempt, a.error_kind) for a in history] == [(1, "lost")]
    database.dispose()


@pytest.mark.long
def test_an_infeasible_job_fails_once_with_what_it_asked_and_an_alert_fires(
    ray_cluster: RayCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    """No node has ``evald_nowhere``: the job waits, its state saying Ray finds it INFEASIBLE and when it
    fails; past ``infeasible_timeout_secs`` it fails ``infeasible`` (no retry), naming what it asked, and
    the ``eval_failed`` alert fires with it."""
    database = upgraded(sqlite_url)
    daemon = ray_config(
        tmp_path,
        sqlite_url,
        ray_cluster,
        dataset=dataset,
        executor_extra="probe_job_dir = false",
        ray_extra='resources = { "evald_nowhere" = 1 }\ninfeasible_timeout_secs = 5',
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", {"HF_HUB_OFFLINE": "1"}) as process:
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            text = _status(daemon)
            alerts = json.loads(evald("--config", str(daemon.config), "alerts", "--format", "json").stdout)
            assert process.stop() == 0
    finally:
        daemon.stop_all()

    asked = "1 bundle {CPU: 1, evald_nowhere: 1} (STRICT_PACK)"
    (job,) = rows
    assert (job.state, job.attempts, job.error_kind) == ("failed", 1, "infeasible")
    assert job.error is not None and f"is INFEASIBLE: no node of the cluster can hold {asked}" in job.error
    assert len(daemon.submissions()) == 1
    events = all_log_events(tmp_path / "daemon.log")
    waiting = [str(e["state"]) for e in events if e["event"] == "job.scheduler_state"]
    assert any("placement group INFEASIBLE since " in s and ", the job fails at " in s for s in waiting), (
        waiting
    )
    (failed,) = [e for e in events if e["event"] == "job.failed"]
    assert failed["kind"] == "infeasible" and asked in str(failed["error"])
    assert "job.retrying" not in [e["event"] for e in events]
    (line,) = [line for line in text.splitlines() if line.startswith("  failed: step_10")]
    assert f"(job {job.id}, 1 of 3 attempt(s)): Ray job {daemon.prefix}-1-1 FAILED: Ray says" in line, line
    (alert,) = alerts
    assert (alert["rule"], alert["state"]) == ("eval_failed", "firing")
    assert "infeasible: " in alert["message"] and "evald_nowhere" in alert["message"]
    database.dispose()
