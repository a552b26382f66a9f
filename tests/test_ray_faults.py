"""The daemon on Ray when the cluster fails under it: a worker node killed mid-job, the head restarted.

Both break the cluster for anyone else, so they run on a private cluster of this module's own (the same
tests/raycluster.py, under another root and other ports), not the session's shared one. A killed node
ends its job ``node_fail`` and the job is retried on the node left; a head that restarts forgets its jobs
(Ray without an external GCS store): the daemon says once that Ray is away, lives, says when it is back,
and the job it lost is retried (``lost``, its next submission logged ``job.resubmitted``). Both are
``long`` (a cluster start alone is ~45 s here).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import queries
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import all_jobs_done, running_daemon, upgraded, wait_for, write_dataset
from tests.raycluster import RayCluster, RayUnavailable, required
from tests.test_ray_daemon import RayDaemon, _count, _gate, _go, ray_config

pytestmark = pytest.mark.long

WAIT_S = 300.0


@pytest.fixture(scope="module")
def private_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        if required():
            pytest.fail(f"no Ray: {exc}")
        pytest.skip(f"no Ray: {exc}")
    # A short root: Ray's socket paths live under it and must stay under 108 bytes.
    cluster = RayCluster(Path(f"/tmp/evald-ray-private-{tmp_path_factory.getbasetemp().name}"))
    try:
        cluster.start()
    except RayUnavailable as exc:
        cluster.stop()
        pytest.fail(str(exc)) if required() else pytest.skip(str(exc))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ray-faults-data") / "arith.jsonl", 4)


def _running_on(daemon: RayDaemon) -> str | None:
    """The node id the first attempt's rank runs on, once its task runs (the first line of its log)."""
    for log in daemon.job_dir.glob("*-1/worker.log"):
        match = re.search(r"evald: rank 0 on Ray node ([0-9a-f]+)", log.read_text(errors="replace"))
        if match:
            return match.group(1)
    return None


def test_a_worker_node_killed_mid_job_ends_it_node_fail_and_it_is_retried_on_another(
    private_cluster: RayCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    daemon = ray_config(
        tmp_path,
        sqlite_url,
        private_cluster,
        dataset=dataset,
        executor_extra=f'python = "{_gate(tmp_path)}"\nprobe_job_dir = false',
        ray_extra='resources = { "evald_worker" = 1 }',
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    killed = ""
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", {"HF_HUB_OFFLINE": "1"}) as process:
            node_id = wait_for(lambda: _running_on(daemon), 120, "the job running", process.process)
            names = {v: k for k, v in private_cluster.node_ids().items()}
            killed = names[node_id]
            private_cluster.kill_node(killed)
            retried = wait_for(
                lambda: (daemon.job_dir / "1-2" / "spec.json").exists() or None,
                120,
                "a retry",
                process.process,
            )
            assert retried
            wait_for(
                lambda: (daemon.job_dir / "1-2" / "worker.log").exists() or None, 120, "the retry running"
            )
            _go(daemon)
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            assert process.stop() == 0
    finally:
        daemon.stop_all()
        if killed:
            private_cluster.start_worker(killed)
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 2)]
    with database.session() as session:
        history = queries.job_history(session, rows[0].id)
    assert [a.outcome for a in history][-1] == "succeeded"
    assert "node_fail" in [a.error_kind for a in history]
    assert len(daemon.submissions()) == 2
    database.dispose()


def test_the_head_restarted_mid_job_the_daemon_lives_says_so_once_and_the_lost_job_is_retried(
    private_cluster: RayCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    daemon = ray_config(
        tmp_path,
        sqlite_url,
        private_cluster,
        dataset=dataset,
        executor_extra=f'python = "{_gate(tmp_path)}"\nprobe_job_dir = false',
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", {"HF_HUB_OFFLINE": "1"}) as process:
            wait_for(lambda: _running_on(daemon), 120, "the job running", process.process)
            # The head first, with the job's driver on it: a worker node killed first may be seen dying
            # by the driver, which then ends the job node_fail (the worker-node test's case), not lost.
            for name in ("head", "a", "b"):
                private_cluster.kill_node(name)
            wait_for(lambda: _count(process.log)["executor.unreachable"] or None, 60, "unreachable")
            assert process.process.poll() is None
            private_cluster.start()
            wait_for(
                lambda: _count(process.log)["executor.reachable"] or None, 120, "reachable", process.process
            )
            wait_for(
                lambda: (daemon.job_dir / "1-2" / "spec.json").exists() or None,
                120,
                "a retry",
                process.process,
            )
            _go(daemon)
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            assert process.stop() == 0
    finally:
        daemon.stop_all()
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 2)]
    events = _count(tmp_path / "daemon.log")
    # One outage for the restart; a submission meanwhile may meet the restarted head before its job agent
    # is up (HTTP 500 "No available agent to submit job"): a second, short one, said and ended alike.
    assert 1 <= events["executor.unreachable"] == events["executor.reachable"] <= 2
    assert "scheduler.pass_failed" not in events and "executor.unusable" not in events
    # The lost job's next attempt is a new submission, said so; nothing was re-attached.
    assert events["job.resubmitted"] == 1 and "job.reattached" not in events
    with database.session() as session:
        history = queries.job_history(session, rows[0].id)
    assert history[0].error_kind == "lost"
    assert Counter(a.outcome for a in history)["succeeded"] == 1
    database.dispose()
