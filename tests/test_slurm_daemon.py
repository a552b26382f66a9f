"""The daemon with ``[executor] kind = "slurm"`` against the real one-host cluster (tests/slurmcluster.py).

The toy checkpoints are evaluated through ``sbatch`` by a real daemon process; submissions are counted
by an ``sbatch`` on the daemon's PATH that logs each call before running the real one
(tests/slurmdaemon.py). A job that must stay queued is submitted held (``--hold`` in ``extra_sbatch``)
and released with ``scontrol release``; one that must stay running waits in its setup script for a file
the test writes into its job folder. Skipped where no cluster answers unless ``EVALD_REQUIRE_SLURM=1``.

The fast tests (unmarked) check the wiring: the ``[executor]`` section, the scheduler's ends mapped to
attempt outcomes, migration 0011, the claim's limits and order, and the runner submitting a job to the
real cluster and re-attaching to it by name (held, so no worker runs). Evaluations through Slurm and the
multi-process scenarios (kill -9, outages, scancel from outside) are ``long``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect as sa_inspect
from sqlalchemy import text as sa_text
from sqlalchemy import update

from daemon.config import Config, load_config
from daemon.errors import ConfigError
from daemon.running import remote
from daemon.running.attempt import RETRYABLE
from daemon.running.executors.base import Ended, EndKind, Placement
from daemon.running.runner import JobRunner
from inference.spec import InferenceSpec, JobSpec, TaskSpec
from storage import migrations, queries
from storage.database import Database
from storage.models import Checkpoint, CheckpointState, EvalJob
from storage.queries import job_handle, record_handle, submitted_per_run
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.deadlines import Deadline, patient
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    all_log_events,
    checkpoints,
    evald,
    jobs,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.slurmcluster import SlurmCluster, slurm_cluster
from tests.slurmdaemon import SlurmDaemon, history_json, slurm_config

__all__ = ["slurm_cluster"]

#: Metrics that are the same wherever the worker runs (the timings are not).
STABLE = ("accuracy", "response_length", "truncation_rate")
WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.2; done\n"
WAIT_S = 240.0


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("slurm-daemon-data") / "arith.jsonl", 8)


@pytest.fixture
def trained(toy_run: ToyRun) -> Path:
    return toy_run.last_checkpoint


def _stable_results(database: Database) -> dict[tuple[str, str], float]:
    with database.session() as session:
        rows = queries.result_rows(session)
    return {(r.checkpoint, r.metric): r.value for r in rows if r.metric in STABLE}


def _log_events(log: Path) -> Counter[str]:
    return Counter(str(e.get("event", "")) for e in all_log_events(log))


def _release_all(daemon: SlurmDaemon) -> None:
    for job in daemon.queue():
        subprocess.run(
            ["scontrol", "release", job["id"]], env=daemon.env, capture_output=True, timeout=patient(60)
        )


def _go(daemon: SlurmDaemon) -> None:
    """Let every job waiting in its setup script go on."""
    for folder in daemon.job_dir.iterdir():
        if folder.is_dir():
            (folder / "go").touch()


def _states(daemon: SlurmDaemon) -> list[str]:
    return [j["state"] for j in daemon.queue()]


# --- fast: the wiring ------------------------------------------------------------------------------


def test_the_executor_section_is_part_of_the_config(tmp_path: Path, dataset: Path) -> None:
    path = write_config(tmp_path, f"sqlite:///{tmp_path}/db.sqlite", dataset=dataset)
    assert load_config(path).executor.kind == "local"
    jobs_dir = tmp_path / "jobs"
    jobs_dir.mkdir()
    text = path.read_text(encoding="utf-8")
    path.write_text(
        text + f'\n[executor]\nkind = "slurm"\npartition = "gpu"\njob_dir = "{jobs_dir}"\nmax_queued = 3\n'
    )
    loaded = load_config(path).executor
    assert (loaded.kind, loaded.partition, loaded.job_dir, loaded.max_queued) == ("slurm", "gpu", jobs_dir, 3)
    path.write_text(text + '\n[executor]\nkind = "slurm"\njob_dir = "/nowhere/at/all"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    said = "\n".join(raised.value.problems)
    assert "executor.partition" in said and "executor.job_dir" in said and "/nowhere/at/all" in said


def _spec(folder: Path) -> JobSpec:
    folder.mkdir(parents=True, exist_ok=True)
    return JobSpec(
        job_id=1,
        checkpoint_path=folder,
        task=TaskSpec(name="arith", dataset=folder / "d.jsonl"),
        inference=InferenceSpec(),
        result_path=folder / "result.json",
    )


@pytest.mark.parametrize(
    ("kind", "outcome_kind", "retried"),
    [
        (EndKind.TIMEOUT, "timeout", True),
        (EndKind.PREEMPTED, "preempted", True),
        (EndKind.NODE_FAIL, "node_fail", True),
        (EndKind.LOST, "lost", True),
        (EndKind.CANCELLED, "cancelled", False),
        (EndKind.OUT_OF_MEMORY, "out_of_memory", False),
    ],
)
def test_scheduler_ends_become_attempt_outcomes(
    tmp_path: Path, kind: EndKind, outcome_kind: str, retried: bool
) -> None:
    spec = _spec(tmp_path / "job")
    ended = Ended(
        kind, f"Slurm job 7 {kind.value.upper()} on node3", log_tail="the last line", placement=Placement()
    )
    outcome = remote.outcome_of(ended, spec)
    assert outcome.error_kind == outcome_kind and outcome.result is None
    assert "Slurm job 7" in outcome.error and "the last line" in outcome.error
    # out_of_memory is rerun at half the batch size (its own path), not retried as is.
    assert (outcome_kind in RETRYABLE) is retried


def test_a_failed_job_keeps_the_log_tail_and_the_workers_own_error(tmp_path: Path) -> None:
    spec = _spec(tmp_path / "job")
    (spec.result_path.parent / "worker.log").write_text("Traceback ...\nRuntimeError: boom\n")
    crashed = remote.outcome_of(
        Ended(
            EndKind.FAILED,
            "Slurm job 9 FAILED on vm: exit status 1",
            exit_code=1,
            log_tail="RuntimeError: boom",
        ),
        spec,
    )
    assert crashed.error_kind == "crash" and "Slurm job 9 FAILED" in crashed.error and "boom" in crashed.error
    spec.result_path.write_text(
        json.dumps(
            {"job_id": 1, "error": {"kind": "checkpoint_invalid", "message": "no config.json in step_5"}}
        )
    )
    rejected = remote.outcome_of(Ended(EndKind.FAILED, "Slurm job 9 FAILED", exit_code=3), spec)
    assert (rejected.error_kind, rejected.error) == ("checkpoint_invalid", "no config.json in step_5")


@pytest.mark.long  # the toy worker's own 10-20 s: the fast wiring test is the found-by-name one below
def test_the_runner_evaluates_a_checkpoint_through_slurm_and_records_the_slurm_job(
    slurm_cluster: SlurmCluster,
    sqlite_url: str,
    dataset: Path,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    daemon = slurm_config(tmp_path, sqlite_url, slurm_cluster, dataset=dataset)
    monkeypatch.setenv("PATH", daemon.env["PATH"])
    database = upgraded(sqlite_url)
    config = load_config(daemon.config)
    copy_checkpoint(trained, tmp_path / "run" / "step_10")
    with database.session() as session:
        run_id = queries.ensure_run(session, "toy", str(tmp_path / "run"))
        checkpoint = queries.record_checkpoint(
            session,
            run_id=run_id,
            path=str(tmp_path / "run" / "step_10"),
            name="step_10",
            step=10,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(session, checkpoint_id=checkpoint, step=10, tasks=["arith"])
    runner = JobRunner(config, database, "test:1")
    assert runner.claim_and_start()
    (job_id,) = runner.running

    def handle_stored() -> tuple[int, str | None] | None:
        # sbatch runs on a thread; the pass after its answer stores the handle.
        runner.poll()
        with database.session() as session:
            stored = job_handle(session, job_id)
        return stored if stored is not None and stored[1] is not None else None

    stored = wait_for(handle_stored, 60, "the handle stored")
    assert stored[1] is not None and '"executor": "slurm"' in stored[1]
    deadline = Deadline(WAIT_S)
    while runner.running and not deadline.expired():
        runner.poll()
        time.sleep(0.2)
    assert not runner.running
    (row,) = jobs(database)
    assert row.state == "succeeded", row.error
    with database.session() as session:
        (attempt,) = queries.job_history(session, job_id)
    assert attempt.slurm_job_id is not None and attempt.slurm_job_id.isdigit()
    assert (attempt.outcome, attempt.exit_state, attempt.nodes) == (
        "succeeded",
        "COMPLETED",
        slurm_cluster.node,
    )
    assert attempt.run_s is not None and attempt.queue_wait_s is not None
    assert daemon.sbatch_calls() == 1
    assert set(_stable_results(database)) == {("step_10", m) for m in STABLE}
    database.dispose()


# --- long: the daemon as a process -------------------------------------------------------------------


@pytest.mark.long
def test_toy_checkpoints_through_slurm_equal_the_local_executors_results(
    slurm_cluster: SlurmCluster, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    results = {}
    for kind in ("local", "slurm"):
        folder = tmp_path / kind
        folder.mkdir()
        url = f"sqlite:///{folder / 'evald.sqlite'}"
        database = upgraded(url)
        if kind == "slurm":
            daemon = slurm_config(folder, url, slurm_cluster, dataset=dataset)
            config, env = daemon.config, daemon.env
        else:
            config, env = write_config(folder, url, dataset=dataset), None
        for step in (10, 20):
            copy_checkpoint(trained, folder / "run" / f"step_{step}")
        with running_daemon(config, folder / "daemon.log", env) as process:
            wait_for(lambda: all_jobs_done(database, 2), WAIT_S, "both jobs", process.process)  # noqa: B023
            assert process.stop() == 0
        assert [j.state for j in jobs(database)] == ["succeeded", "succeeded"]
        results[kind] = _stable_results(database)
        if kind == "slurm":
            assert daemon.sbatch_calls() == 2 and daemon.probes() == 1
            # The probe job read back what the daemon wrote into job_dir: the nodes see the folder.
            assert _log_events(folder / "daemon.log")["executor.job_dir_shared"] == 1
            for job in jobs(database):
                (attempt,) = history_json(config, job.id, env or {})
                assert str(attempt["slurm_job_id"]).isdigit() and attempt["exit_state"] == "COMPLETED"
        database.dispose()
    assert results["slurm"] == results["local"] and len(results["local"]) == 2 * len(STABLE)


@pytest.mark.long
def test_kill_9_while_queued_and_while_running_reattaches_without_a_second_submission(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    setup = tmp_path / "setup.sh"
    setup.write_text(WAIT_FOR_GO)
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=dataset,
        executor_extra=f'extra_sbatch = ["--hold"]\nsetup_script = "{setup}"',
    )
    for step in (10, 20):
        copy_checkpoint(trained, tmp_path / "run" / f"step_{step}")
    try:
        first = DaemonProcess(daemon.config, tmp_path / "daemon-1.log", daemon.env)
        first.wait_ready()
        wait_for(
            lambda: _states(daemon) == ["PENDING", "PENDING"] or None, 60, "two held jobs", first.process
        )
        # Killed while both are queued (held): the next daemon re-attaches to them.
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        second = DaemonProcess(daemon.config, tmp_path / "daemon-2.log", daemon.env)
        second.wait_ready()
        wait_for(
            lambda: _log_events(second.log)["job.reattached"] == 2 or None, 60, "re-attached", second.process
        )
        _release_all(daemon)
        wait_for(
            lambda: _states(daemon) == ["RUNNING", "RUNNING"] or None, 120, "both running", second.process
        )
        # Killed while both run (waiting in their setup script): the third re-attaches again.
        assert second.stop(signal.SIGKILL) == -signal.SIGKILL
        with running_daemon(daemon.config, tmp_path / "daemon-3.log", daemon.env) as third:
            wait_for(
                lambda: _log_events(third.log)["job.reattached"] == 2 or None,
                60,
                "re-attached",
                third.process,
            )
            _go(daemon)
            rows = wait_for(lambda: all_jobs_done(database, 2), WAIT_S, "both stored", third.process)
            assert third.stop() == 0
    finally:
        daemon.cancel_all()
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 1), ("succeeded", 1)]
    assert daemon.sbatch_calls() == 2
    with database.session() as session:
        counts = Counter(r.checkpoint for r in queries.result_rows(session))
        histories = [queries.job_history(session, j.id) for j in rows]
    assert set(counts) == {"step_10", "step_20"} and len(set(counts.values())) == 1
    assert [[(a.outcome, a.exit_state) for a in h] for h in histories] == [[("succeeded", "COMPLETED")]] * 2
    database.dispose()


@pytest.mark.long
def test_scancel_from_outside_a_deleted_checkpoint_and_the_queue_limit(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=dataset,
        executor_extra='extra_sbatch = ["--hold"]\nmax_queued = 1',
    )
    for step in (10, 20):
        copy_checkpoint(trained, tmp_path / "run" / f"step_{step}")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            queued = wait_for(lambda: daemon.queue() or None, 60, "a held job", process.process)
            time.sleep(2.0)
            # max_queued = 1: the second job waits in evald's queue, not in Slurm's.
            assert len(daemon.queue()) == 1 and daemon.sbatch_calls() == 1
            status = evald("--config", str(daemon.config), "status", env=daemon.env)
            assert status.returncode == 0, status.stderr
            assert "PENDING (JobHeldUser)" in status.stdout and f"slurm {queued[0]['id']}:" in status.stdout
            shown = json.loads(
                evald("--config", str(daemon.config), "status", "--format", "json", env=daemon.env).stdout
            )
            (running_job,) = shown["runs"]["toy"]["running"]
            assert running_job["slurm_job_id"] == queued[0]["id"]
            assert running_job["scheduler_state"] == "PENDING (JobHeldUser)"
            assert [(j["slurm_job_id"], j["state"], j["reason"]) for j in shown["slurm"]["jobs"]] == [
                (queued[0]["id"], "PENDING", "JobHeldUser")
            ]
            subprocess.run(["scancel", queued[0]["id"]], env=daemon.env, check=True, timeout=patient(60))
            # The cancelled one fails (someone meant it); the other is submitted in its room.
            wait_for(lambda: daemon.sbatch_calls() == 2 or None, 60, "the second submission", process.process)
            wait_for(
                lambda: len([j for j in daemon.queue() if j["state"] == "PENDING"]) == 1 or None, 60, "held"
            )
            second = next(j for j in jobs(database) if j.state == "running")
            path = tmp_path / "run" / f"step_{second.step}"
            shutil.rmtree(path)
            rows = wait_for(lambda: all_jobs_done(database, 2), 60, "both ended", process.process)
            assert process.stop() == 0
    finally:
        daemon.cancel_all()
    by_kind = {j.error_kind: j for j in rows}
    assert set(by_kind) == {"cancelled", "checkpoint_vanished"}
    assert all(j.state == "failed" for j in rows) and daemon.sbatch_calls() == 2
    assert "outside evald" in (by_kind["cancelled"].error or "")
    with database.session() as session:
        cancelled = queries.job_history(session, by_kind["cancelled"].id)
        vanished = queries.job_history(session, by_kind["checkpoint_vanished"].id)
    assert [(a.outcome, a.exit_state) for a in cancelled] == [("failed", "CANCELLED")]
    assert [(a.outcome, a.exit_state) for a in vanished] == [("cancelled", "CANCELLED")]
    assert daemon.queue() == [] or all(j["state"] == "CANCELLED" for j in daemon.queue())
    database.dispose()


@pytest.mark.long
def test_a_bad_partition_is_one_clear_error_and_the_daemon_goes_on_once_it_is_fixed(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    daemon = slurm_config(tmp_path, sqlite_url, slurm_cluster, dataset=dataset, partition="nosuchpart")
    copy_checkpoint(trained, tmp_path / "run" / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            wait_for(lambda: _log_events(process.log)["executor.unusable"] or None, 60, "executor.unusable")
            wait_for(lambda: [j for j in jobs(database) if j.state == "pending"] or None, 60, "a pending job")
            time.sleep(2.0)
            assert [j.state for j in jobs(database)] == ["pending"] and daemon.sbatch_calls() == 0
            line = next(
                json.loads(x) for x in process.log.read_text().splitlines() if '"executor.unusable"' in x
            )
            assert "executor.partition" in line["error"] and "'nosuchpart'" in line["error"]
            assert "debug" in line["error"]  # the partitions there are
            assert process.process.poll() is None
            status = evald("--config", str(daemon.config), "status", env=daemon.env)
            assert status.returncode == 0 and "not submitting: executor.partition" in status.stdout
            text = daemon.config.read_text().replace('partition = "nosuchpart"', 'partition = "debug"')
            daemon.config.write_text(text)
            process.process.send_signal(signal.SIGHUP)
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            assert process.stop() == 0
    finally:
        daemon.cancel_all()
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 1)] and daemon.sbatch_calls() == 1
    assert _log_events(tmp_path / "daemon.log")["executor.usable"] == 1
    database.dispose()


@pytest.mark.long
def test_gpus_refused_by_a_cpu_partition_keep_the_job_queued_until_the_config_is_fixed(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    # device = "cuda" asks Slurm for a GPU per rank (--gpus-per-node=1): the test cluster has none, and
    # sbatch refuses it as it would every job of this config. The folder probe asks for no GPU: it runs.
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path, sqlite_url, slurm_cluster, dataset=dataset, inference_extra='device = "cuda"'
    )
    copy_checkpoint(trained, tmp_path / "run" / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            wait_for(lambda: _log_events(process.log)["executor.unusable"] or None, 60, "executor.unusable")
            time.sleep(2.0)
            (job,) = jobs(database)
            assert (job.state, job.attempts) == ("pending", 0) and process.process.poll() is None
            line = next(
                json.loads(x) for x in process.log.read_text().splitlines() if '"executor.unusable"' in x
            )
            assert line["error"].startswith("executor.gpu_request: ") and "GRES: none" in line["error"]
            status = evald("--config", str(daemon.config), "status", env=daemon.env)
            assert status.returncode == 0 and "not submitting: executor.gpu_request" in status.stdout
            daemon.config.write_text(daemon.config.read_text().replace('device = "cuda"', 'device = "cpu"'))
            process.process.send_signal(signal.SIGHUP)
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            assert process.stop() == 0
    finally:
        daemon.cancel_all()
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 1)]
    events = _log_events(tmp_path / "daemon.log")
    assert (events["executor.unusable"], events["executor.usable"], events["job.failed"]) == (1, 1, 0)
    with database.session() as session:
        history = queries.job_history(session, rows[0].id)
    assert [(a.outcome, a.error_kind) for a in history] == [
        ("requeued", "executor_unusable"),
        ("succeeded", None),
    ]
    database.dispose()


@pytest.mark.long
def test_slurmctld_restarted_mid_job_the_daemon_lives_and_nothing_is_lost_or_doubled(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    setup = tmp_path / "setup.sh"
    setup.write_text(WAIT_FOR_GO)
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path, sqlite_url, slurm_cluster, dataset=dataset, executor_extra=f'setup_script = "{setup}"'
    )
    copy_checkpoint(trained, tmp_path / "run" / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            wait_for(lambda: _states(daemon) == ["RUNNING"] or None, 120, "a running job", process.process)
            # The job's ranks start (srun asks the controller for its step), then the controller goes.
            _go(daemon)
            wait_for(lambda: list(daemon.job_dir.glob("*/rank-0.log")) or None, 60, "the worker started")
            stopped = time.monotonic()
            slurm_cluster.stop_controller()
            try:
                wait_for(lambda: _log_events(process.log)["executor.unreachable"] or None, 60, "unreachable")
                # While it is away the loop goes on: the job's result is stored from its folder, and a
                # new checkpoint is found.
                copy_checkpoint(trained, tmp_path / "run" / "step_20")
                done = lambda: any(j.state == "succeeded" for j in jobs(database)) or None  # noqa: E731
                wait_for(done, WAIT_S, "the result stored while slurmctld is away", process.process)
                found = lambda: any(c.name == "step_20" for c in checkpoints(database)) or None  # noqa: E731
                wait_for(found, 60, "step_20 found while slurmctld is away", process.process)
                assert not slurm_cluster.controller_answers() and process.process.poll() is None
            finally:
                slurm_cluster.start_controller()
                started = time.monotonic()
            wait_for(lambda: _log_events(process.log)["executor.reachable"] or None, 60, "reachable")

            def all_done() -> list[queries.JobRow] | None:
                _go(daemon)
                return all_jobs_done(database, 2)

            rows = wait_for(all_done, WAIT_S, "both jobs", process.process)
            assert process.stop() == 0
    finally:
        if not slurm_cluster.controller_answers():
            slurm_cluster.start_controller()
        daemon.cancel_all()
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 1)] * 2 and daemon.sbatch_calls() == 2
    events = _log_events(tmp_path / "daemon.log")
    assert events["executor.unreachable"] == 1 and events["executor.reachable"] == 1
    # down_secs counts from the controller's last answer before the outage, not from its detection.
    (back,) = [
        json.loads(x)
        for x in (tmp_path / "daemon.log").read_text().splitlines()
        if '"executor.reachable"' in x
    ]
    assert float(back["down_secs"]) >= started - stopped - 1.0
    # Away is not unusable: nothing was failed or requeued for it, and no pass of the loop failed.
    assert "executor.unusable" not in events and "scheduler.pass_failed" not in events
    assert "job.retrying" not in events and "job.failed" not in events
    with database.session() as session:
        assert len(queries.result_rows(session)) > 0


def _held_job(
    slurm_cluster: SlurmCluster,
    url: str,
    *,
    dataset: Path,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[SlurmDaemon, Database, Config]:
    """A daemon's config whose Slurm jobs are submitted held (``--hold``: they wait until released), the
    Slurm tools on this process's PATH, and one ready job in the upgraded database at ``url``."""
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    daemon = slurm_config(
        tmp_path, url, slurm_cluster, dataset=dataset, executor_extra='extra_sbatch = ["--hold"]'
    )
    monkeypatch.setenv("PATH", daemon.env["PATH"])
    database = upgraded(url)
    _one_ready_job(database, tmp_path / "run", trained)
    return daemon, database, load_config(daemon.config)


def _one_ready_job(database: Database, root: Path, trained: Path) -> None:
    copy_checkpoint(trained, root / "step_10")
    with database.session() as session:
        run_id = queries.ensure_run(session, "toy", str(root))
        checkpoint = queries.record_checkpoint(
            session,
            run_id=run_id,
            path=str(root / "step_10"),
            name="step_10",
            step=10,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(session, checkpoint_id=checkpoint, step=10, tasks=["arith"])


@pytest.mark.long
@pytest.mark.postgres
def test_a_daemon_taking_over_a_lease_reattaches_and_the_old_holder_leaves_the_slurm_job_alone(
    slurm_cluster: SlurmCluster,
    postgres_url: str,
    dataset: Path,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon, database, config = _held_job(
        slurm_cluster,
        postgres_url,
        dataset=dataset,
        trained=trained,
        tmp_path=tmp_path,
        monkeypatch=monkeypatch,
    )
    try:
        holder = JobRunner(config, database, "host-a:1")
        assert holder.claim_and_start()
        holder.settle(60)  # sbatch answered, the handle stored
        (job_id,) = holder.running
        # The holder goes silent past its lease; the other daemon finds the claim orphaned.
        with database.session() as session:
            session.execute(
                update(EvalJob)
                .where(EvalJob.id == job_id)
                .values(heartbeat_at=datetime(2000, 1, 1, tzinfo=UTC))
            )
        taker = JobRunner(config, database, "host-b:2")
        with database.session() as session:
            (orphan,) = queries.orphans(session, lease=timedelta(seconds=5), every_running=False)
            assert taker.reattach(session, orphan)
        assert job_id in taker.running
        # The old holder's next beat finds the claim taken: it lets go without cancelling the Slurm job.
        holder.running[job_id].last_heartbeat = 0.0
        holder.poll()
        assert not holder.running
        _release_all(daemon)
        deadline = Deadline(WAIT_S)
        while taker.running and not deadline.expired():
            taker.poll()
            time.sleep(0.2)
        (row,) = jobs(database)
        assert (row.state, row.attempts) == ("succeeded", 1), row.error
        with database.session() as session:
            history = queries.job_history(session, job_id)
        assert [(a.outcome, a.exit_state) for a in history] == [("succeeded", "COMPLETED")]
        assert daemon.sbatch_calls() == 1
    finally:
        daemon.cancel_all()
        database.dispose()


# --- fast: storage -------------------------------------------------------------------------------------


def test_migration_0011_adds_the_slurm_columns_and_goes_back(database: Database) -> None:

    with database.session() as session:
        run_id = queries.ensure_run(session, "toy", "/runs/toy")
        checkpoint = queries.record_checkpoint(
            session,
            run_id=run_id,
            path="/runs/toy/step_1",
            name="step_1",
            step=1,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(session, checkpoint_id=checkpoint, step=1, tasks=["arith"])
        job = queries.claim_next_job(session, "test:1")
        assert job is not None
        assert record_handle(session, job_id=job.id, owner="test:1", attempt=1, handle='{"external_id": "7"}')
        now = datetime.now(UTC)
        queries.record_attempt(
            session,
            queries.AttemptRow(
                job_id=job.id,
                attempt=1,
                engine="hf",
                tp=1,
                dp=1,
                batch_size=4,
                outcome="succeeded",
                error_kind=None,
                error=None,
                started_at=now,
                finished_at=now,
                duration_s=1.0,
                slurm_job_id="7",
                nodes="node[1-2]",
                queue_wait_s=3.0,
                run_s=9.0,
                exit_state="COMPLETED",
            ),
        )
    with database.session() as session:
        (attempt,) = queries.job_history(session, job.id)
        assert (attempt.slurm_job_id, attempt.nodes, attempt.queue_wait_s, attempt.exit_state) == (
            "7",
            "node[1-2]",
            3.0,
            "COMPLETED",
        )
        assert job_handle(session, job.id) == (1, '{"external_id": "7"}')
    migrations.downgrade(database, "0010")
    with database.engine.connect() as conn:
        columns = {c["name"] for c in sa_inspect(conn).get_columns("job_attempts")}
        jobs_columns = {c["name"] for c in sa_inspect(conn).get_columns("eval_jobs")}
        kept = conn.execute(sa_text("SELECT outcome FROM job_attempts")).scalars().all()
    assert "slurm_job_id" not in columns and "executor_handle" not in jobs_columns and kept == ["succeeded"]
    migrations.upgrade(database)
    assert migrations.current_revision(database) == migrations.head_revision() >= "0011"


def test_newest_first_and_runs_at_their_limit_in_the_claim(database: Database) -> None:
    with database.session() as session:
        ids = {}
        for run in ("a", "b"):
            run_id = queries.ensure_run(session, run, f"/runs/{run}")
            ids[run] = run_id
            for step in (1, 2):
                checkpoint = queries.record_checkpoint(
                    session,
                    run_id=run_id,
                    path=f"/runs/{run}/step_{step}",
                    name=f"step_{step}",
                    step=step,
                    epoch=None,
                    layout="hf",
                    state=CheckpointState.READY,
                )
                queries.enqueue_jobs(session, checkpoint_id=checkpoint, step=step, tasks=["arith"])
        # Run a's step 1 became ready last: "newest" takes it, whatever the steps and the run order.
        session.execute(
            update(Checkpoint)
            .where(Checkpoint.path == "/runs/a/step_1")
            .values(ready_at=datetime(2030, 1, 1, tzinfo=UTC))
        )
    with database.session() as session:
        first = queries.claim_next_job(session, "test:1", newest_first=True)
        assert first is not None and (first.run, first.step) == ("a", 1)
        assert record_handle(session, job_id=first.id, owner="test:1", attempt=1, handle="{}")
        assert submitted_per_run(session) == {ids["a"]: 1}
    with database.session() as session:
        # Run a at its per-run limit: only b's jobs are claimed, in the schedule's order (newest step).
        second = queries.claim_next_job(session, "test:1", exclude_runs={ids["a"]})
        third = queries.claim_next_job(session, "test:1", exclude_runs={ids["a"]})
        fourth = queries.claim_next_job(session, "test:1", exclude_runs={ids["a"]})
    assert second is not None and third is not None and fourth is None
    assert [(second.run, second.step), (third.run, third.step)] == [("b", 2), ("b", 1)]


def test_a_submission_whose_id_was_never_stored_is_found_by_name_and_adopted(
    slurm_cluster: SlurmCluster,
    sqlite_url: str,
    dataset: Path,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    daemon, database, config = _held_job(
        slurm_cluster,
        sqlite_url,
        dataset=dataset,
        trained=trained,
        tmp_path=tmp_path,
        monkeypatch=monkeypatch,
    )
    try:
        first = JobRunner(config, database, "host-a:1")
        assert first.claim_and_start()
        first.settle(60)
        (job_id,) = first.running
        # The daemon died between sbatch and storing the id: the claim has no handle, and the folder's
        # own record of it is gone too; only the controller knows the job, by its name and comment.
        with database.session() as session:
            record_handle(session, job_id=job_id, owner="host-a:1", attempt=1, handle=None)
        (daemon.job_dir / f"{job_id}-1" / "slurm_job_id").unlink()
        (queued,) = daemon.queue()
        second = JobRunner(config, database, "host-b:2")
        with database.session() as session:
            (orphan,) = queries.orphans(session, lease=timedelta(seconds=5), every_running=True)
            assert orphan.executor_handle is None
            assert second.reattach(session, orphan)
        assert second.running[job_id].handle is not None
        assert second.running[job_id].handle.external_id == queued["id"]  # type: ignore[union-attr]
        with database.session() as session:
            stored = job_handle(session, job_id)
        assert stored is not None and f'"external_id": "{queued["id"]}"' in (stored[1] or "")
        second.poll()
        assert daemon.sbatch_calls() == 1 and len(daemon.queue()) == 1
    finally:
        daemon.cancel_all()
        database.dispose()


@pytest.mark.long
def test_a_run_removed_while_its_job_is_queued_is_cancelled_and_the_other_run_goes_on(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    second_run = f'\n[[runs]]\nname = "other"\nroot = "{other}"\n'
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=dataset,
        run_extra=second_run,
        executor_extra='extra_sbatch = ["--hold"]',
    )
    copy_checkpoint(trained, tmp_path / "run" / "step_10")
    copy_checkpoint(trained, other / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            wait_for(
                lambda: _states(daemon) == ["PENDING", "PENDING"] or None,
                60,
                "two held jobs",
                process.process,
            )
            process.process.send_signal(signal.SIGHUP)  # nothing changed yet: a reload keeps both
            daemon.config.write_text(daemon.config.read_text().replace(second_run, ""))
            process.process.send_signal(signal.SIGHUP)
            removed = wait_for(
                lambda: [j for j in jobs(database) if j.run == "other" and j.state == "pending"] or None,
                60,
                "the removed run's job back in evald's queue",
                process.process,
            )
            assert [j["state"] for j in daemon.queue()].count("CANCELLED") == 1
            _release_all(daemon)
            wait_for(
                lambda: [j for j in jobs(database) if j.run == "toy" and j.state == "succeeded"] or None,
                WAIT_S,
                "the other run's job",
                process.process,
            )
            assert process.stop() == 0
    finally:
        daemon.cancel_all()
    with database.session() as session:
        history = queries.job_history(session, removed[0].id)
    assert [(a.outcome, a.error_kind, a.exit_state) for a in history] == [
        ("cancelled", "run_removed", "CANCELLED")
    ]
    assert removed[0].attempts == 0 and daemon.sbatch_calls() == 2
    database.dispose()


@pytest.mark.long
def test_a_job_past_its_time_limit_is_retried_with_twice_the_time(
    slurm_cluster: SlurmCluster, sqlite_url: str, dataset: Path, trained: Path, tmp_path: Path
) -> None:
    setup = tmp_path / "setup.sh"
    setup.write_text(WAIT_FOR_GO)
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=dataset,
        time_limit="1",
        inference_extra="max_attempts = 2",
        executor_extra=f'setup_script = "{setup}"',
    )
    copy_checkpoint(trained, tmp_path / "run" / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            # The first attempt waits for a "go" that never comes: Slurm kills it at its one minute.
            retried = wait_for(
                lambda: [j for j in jobs(database) if j.attempts == 2] or None, 180, "a second attempt"
            )
            wait_for(
                lambda: (daemon.job_dir / f"{retried[0].id}-2" / "job.sbatch").exists() or None, 60, "it"
            )
            (daemon.job_dir / f"{retried[0].id}-2" / "go").touch()
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            assert process.stop() == 0
    finally:
        daemon.cancel_all()
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 2)] and daemon.sbatch_calls() == 2
    # The retry ran with twice the time (the default most is 4 × the limit).
    assert "#SBATCH --time=1\n" in (daemon.job_dir / f"{rows[0].id}-1" / "job.sbatch").read_text()
    assert "#SBATCH --time=2\n" in (daemon.job_dir / f"{rows[0].id}-2" / "job.sbatch").read_text()
    with database.session() as session:
        history = queries.job_history(session, rows[0].id)
    assert [(a.outcome, a.error_kind, a.exit_state) for a in history] == [
        ("retried", "timeout", "TIMEOUT"),
        ("succeeded", None, "COMPLETED"),
    ]
    assert (
        history[0].error is not None and "TIMEOUT" in history[0].error and "limit 0:01:00" in history[0].error
    )
    assert "the next attempt gets 0:02:00 (--time=2)" in history[0].error
    database.dispose()
