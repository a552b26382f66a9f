"""The Slurm retry policy (daemon/running/retries.py) and sbatch's refusals, as a cluster user meets them.

- A refusal of ``sbatch`` for the config's sake (a ``--constraint`` typo, GPUs asked of a CPU partition,
  an account or QoS Slurm does not know) fails no job: one ``executor.unusable`` line naming the
  setting, the job back in evald's queue, claiming paused until a check (``sbatch --test-only`` of the
  refused script) or a reload finds it taken.
- TIMEOUT: the retry gets twice the time, up to ``max_time_limit`` within the partition's MaxTime; a job
  that times out at that most fails at once. NODE_FAIL: the failed node is kept out of the retry
  (``--exclude``). PREEMPTED: back to the queue without spending an attempt, ``free_preemptions`` times
  in a row; past them a preemption spends one.

The pure policy and the texts are tested without a cluster; the refusals and the adjusted submissions on
the tests' one-host cluster (tests/slurmcluster.py). Preemption, a failed node and a partition's MaxTime
need a cluster configured for them: :class:`TwoNodeCluster` is a second cluster of this file's own, two
nodes (one CPU each) on this host, with ``PreemptType=preempt/partition_prio`` and partitions ``low``
(preemptible), ``high`` (preempts it), ``main`` and ``short`` (MaxTime 2 minutes). Its scenarios run
the daemon on the toy model and are ``long``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock
from structlog.testing import capture_logs

from daemon.config import ExecutorConfig, load_config
from daemon.running import retries
from daemon.running.attempt import Verdict, verdict
from daemon.running.executors.base import (
    Active,
    Adjustments,
    ExecutorError,
    ExecutorMisconfigured,
    JobRef,
)
from daemon.running.executors.slurm import SlurmExecutor
from daemon.running.executors.slurm_output import (
    OTHER_REFUSAL,
    parse_scontrol_job,
    parse_sinfo_limits,
    refusal,
)
from daemon.running.runner import JobRunner
from inference.spec import InferenceSpec, JobSpec, TaskSpec
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from storage.queries import AttemptRow
from tests.checkpoints import copy_checkpoint
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import patient
from tests.harness import all_jobs_done, evald, jobs, running_daemon, upgraded, wait_for, write_dataset
from tests.slurmcluster import (
    PARTITION,
    ClusterUnavailable,
    SlurmCluster,
    _binary,
    _memory_mb,
    _wait_for,
    conf_text,
    prepare_root,
    required,
    slurm_cluster,
    write_conf,
)
from tests.slurmdaemon import SlurmDaemon, slurm_config

__all__ = ["slurm_cluster"]

OUTPUTS = Path(__file__).parent / "slurm" / "outputs"
WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.2; done\n"
WAIT_S = 240.0
HOUR = 3600


# --- the policy, pure -------------------------------------------------------------------------------


def _row(outcome: str, kind: str | None, state: str | None, nodes: str | None = None) -> AttemptRow:
    now = datetime(2026, 12, 4, tzinfo=UTC)
    return AttemptRow(
        job_id=1,
        attempt=1,
        engine="deepspeed",
        tp=1,
        dp=1,
        batch_size=8,
        outcome=outcome,
        error_kind=kind,
        error=None,
        started_at=now,
        finished_at=now,
        duration_s=1.0,
        slurm_job_id="7" if state else None,
        nodes=nodes,
        exit_state=state,
    )


def test_a_first_attempt_is_submitted_as_configured() -> None:
    plan = retries.plan([], time_limit_s=HOUR, max_time_limit_s=4 * HOUR)
    assert (plan.time_limit_s, plan.failed_nodes, plan.preemptions, plan.at_time_cap) == (HOUR, (), 0, False)
    assert not plan.adjustments()


def test_each_timeout_doubles_the_time_limit_up_to_the_most() -> None:
    timed_out = _row("retried", "timeout", "TIMEOUT")
    once = retries.plan([timed_out], time_limit_s=HOUR, max_time_limit_s=3 * HOUR)
    twice = retries.plan([timed_out, timed_out], time_limit_s=HOUR, max_time_limit_s=3 * HOUR)
    assert (once.time_limit_s, once.at_time_cap, once.next_time_limit_s) == (2 * HOUR, False, 3 * HOUR)
    assert (twice.time_limit_s, twice.at_time_cap) == (3 * HOUR, True)
    assert once.adjustments() == Adjustments(time_limit_s=2 * HOUR)
    # A local worker killed at job_timeout_secs is not Slurm's TIMEOUT: nothing to raise.
    local = _row("retried", "timeout", None)
    assert retries.plan([local], time_limit_s=HOUR, max_time_limit_s=4 * HOUR).time_limit_s == HOUR
    # A most below the limit (a partition's MaxTime under it): the limit, and no raise.
    assert retries.plan([timed_out], time_limit_s=HOUR, max_time_limit_s=HOUR // 2).at_time_cap


def test_failed_nodes_are_kept_out_and_preemptions_count_in_a_row() -> None:
    history = [
        _row("requeued", "preempted", "PREEMPTED", "n1"),
        _row("retried", "node_fail", "NODE_FAIL", "n2"),
        _row("retried", "node_fail", "NODE_FAIL", "n[3-4]"),
        _row("retried", "node_fail", "NODE_FAIL", "n2"),
        _row("requeued", "preempted", "PREEMPTED", "n1"),
        _row("requeued", "preempted", "PREEMPTED", "n5"),
    ]
    plan = retries.plan(history, time_limit_s=HOUR, max_time_limit_s=4 * HOUR)
    assert plan.failed_nodes == ("n2", "n[3-4]") and plan.preemptions == 2
    assert plan.adjustments() == Adjustments(exclude=("n2", "n[3-4]"))
    assert (
        retries.plan(
            [*history, _row("retried", "crash", "FAILED")], time_limit_s=1, max_time_limit_s=1
        ).preemptions
        == 0
    )


@pytest.mark.parametrize(
    ("kind", "preemptions", "at_cap", "attempt", "expected"),
    [
        ("preempted", 0, False, 1, Verdict.PREEMPTED),
        ("preempted", 2, False, 3, Verdict.PREEMPTED),  # free: even on the last attempt
        ("preempted", 3, False, 1, Verdict.RETRY),  # past free_preemptions = 3: spends one
        ("preempted", 3, False, 3, Verdict.FAIL),
        ("timeout", 0, False, 1, Verdict.RETRY),
        ("timeout", 0, True, 1, Verdict.TIME_CAP),
        ("timeout", 0, False, 3, Verdict.FAIL),
        ("node_fail", 0, False, 2, Verdict.RETRY),
    ],
)
def test_what_a_scheduler_end_becomes(
    kind: str, preemptions: int, at_cap: bool, attempt: int, expected: Verdict
) -> None:
    step = verdict(
        kind,
        batch_size=8,
        attempt=attempt,
        max_attempts=3,
        stopping=False,
        detached=True,
        preemptions=preemptions,
        free_preemptions=3,
        at_time_cap=at_cap,
    )
    assert step is expected


def test_a_local_timeout_is_retried_as_before() -> None:
    common: dict[str, Any] = {"batch_size": 8, "max_attempts": 3, "stopping": False, "detached": False}
    assert verdict("timeout", attempt=1, at_time_cap=True, **common) is Verdict.RETRY


def test_the_notes_say_what_the_next_attempt_gets() -> None:
    plan = retries.plan([], time_limit_s=HOUR, max_time_limit_s=4 * HOUR)

    def note(kind: str, retry: retries.RetryPlan = plan, *, spent: bool = True, again: bool = True) -> str:
        return retries.note(kind, retry, nodes="n1", free_preemptions=3, spent=spent, again=again)

    assert note("timeout") == "the next attempt gets 2:00:00 (--time=120)"
    assert note("timeout", again=False) == ""  # its attempts spent: no next one to speak of
    capped = retries.plan([], time_limit_s=HOUR, max_time_limit_s=HOUR)
    said = note("timeout", capped, again=False)
    assert said.startswith("timed out at 1:00:00, the most a job may have (executor.max_time_limit")
    assert note("node_fail") == "node(s) n1 are kept out of its next attempts (--exclude)"
    assert note("preempted", spent=False).startswith(
        "preemption 1 in a row: back in evald's queue without spending an attempt (3 in a row are free"
    )
    assert (
        note("preempted") == "preemption 1 in a row, past executor.free_preemptions = 3: it spends an attempt"
    )
    assert note("crash") == ""


# --- what Slurm printed ----------------------------------------------------------------------------


def test_preempted_and_node_fail_as_slurm_22_05_reports_them() -> None:
    # Provoked on a two-node 22.05 cluster: a low-priority partition's job preempted (PreemptMode=CANCEL)
    # by a high one's, and a job whose node was set down (scontrol update nodename=n2 state=down).
    lines = (OUTPUTS / "scontrol-show-job-preempted-node-fail-22.05.txt").read_text().splitlines()
    preempted, node_fail = (parse_scontrol_job(line) for line in lines)
    assert (preempted.state, preempted.nodes, preempted.exit_signal) == ("PREEMPTED", "n1", 15)
    assert (node_fail.state, node_fail.reason, node_fail.nodes) == ("NODE_FAIL", "NodeDown", "n2")
    assert preempted.finished and node_fail.finished


#: sbatch's refusals: the first six printed by Slurm 22.05 here (tests' cluster, no GPUs, no
#: features); the account, QoS, limit and group ones are 22.05's own words (slurm_errno.c), which a
#: cluster without accounting enforcement (this one) never prints.
REFUSED = {
    "sbatch: error: Batch job submission failed: Invalid feature specification": "executor.extra_sbatch",
    "sbatch: error: Invalid generic resource (gres) specification": "executor.gpu_request",
    "sbatch: error: invalid partition specified: nosuch sbatch: error: Batch job submission failed: "
    "Invalid partition name specified": "executor.partition",
    "sbatch: error: Memory specification can not be satisfied sbatch: error: Batch job submission failed: "
    "Requested node configuration is not available": "executor.mem",
    "sbatch: error: Batch job submission failed: Requested reservation is invalid": "executor.extra_sbatch",
    "sbatch: unrecognized option '--constrain=a100' Try \"sbatch --help\" for more information": (
        "executor.extra_sbatch"
    ),
    "sbatch: error: Batch job submission failed: Invalid account or account/partition combination "
    "specified": "executor.account",
    "sbatch: error: Batch job submission failed: Invalid qos specification": "executor.qos",
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, "
    "user's size and/or time limits)": "executor.qos",
    "sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds "
    "some limit)": "executor.time_limit",
    "sbatch: error: Batch job submission failed: User's group not permitted to use this partition": (
        "executor.partition"
    ),
}


@pytest.mark.parametrize(("said", "field"), REFUSED.items())
def test_each_refusal_names_its_setting(said: str, field: str) -> None:
    assert refusal(said).field == field


def test_an_unknown_refusal_names_the_section() -> None:
    assert refusal("sbatch: error: Batch job submission failed: something new") is OTHER_REFUSAL


def test_partition_time_limits_from_sinfo() -> None:
    assert parse_sinfo_limits("debug|infinite\nshort|2:00\nlong|1-00:00:00\nshort|2:00\n") == {
        "debug": None,
        "short": 120,
        "long": 86400,
    }


# --- refusals and adjusted submissions on the tests' cluster ---------------------------------------------


def _executor(cluster: SlurmCluster, folder: Path, **settings: Any) -> SlurmExecutor:
    folder.mkdir(parents=True, exist_ok=True)
    config = ExecutorConfig.model_validate(
        {
            "kind": "slurm",
            "partition": PARTITION,
            "job_dir": folder,
            "name_prefix": f"p{uuid.uuid4().hex[:8]}",
            "time_limit": "5",
            **settings,
        }
    )
    return SlurmExecutor(config, python=sys.executable, env={**SUBPROCESS_ENV, **cluster.env})


def _spec_at(executor: SlurmExecutor, ref: JobRef, *, device: str = "cpu") -> Path:
    """A job's spec in its folder, as the runner writes it (nothing runs it: its job is held or refused)."""
    folder = executor.job_folder(ref)
    folder.mkdir(parents=True, exist_ok=True)
    spec = JobSpec(
        job_id=ref.job_id,
        checkpoint_path=folder,
        task=TaskSpec(name="arith", dataset=folder / "d.jsonl"),
        inference=InferenceSpec(device=device),
        result_path=folder / "result.json",
    )
    path = folder / "spec.json"
    path.write_text(spec.model_dump_json(), encoding="utf-8")
    return path


def _cancel(executor: SlurmExecutor) -> None:
    for _, job in executor.active():
        executor.cli.cancel(job.job_id)


def test_a_constraint_typo_is_the_configs_and_stays_so_until_slurm_takes_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    typo = _executor(slurm_cluster, tmp_path / "jobs", extra_sbatch=["--constraint=a1000"])
    typo.check()  # the partition is there: only a job can tell
    ref = JobRef(5, 1)
    with pytest.raises(ExecutorMisconfigured) as caught:
        typo.start(_spec_at(typo, ref), ref)
    said = str(caught.value)
    assert said.startswith(f"executor.extra_sbatch: sbatch refused the job for partition '{PARTITION}' ")
    assert "a --constraint names a feature no node of the partition has; its nodes' features: none" in said
    assert said.endswith("Invalid feature specification")
    # Every later check (the daemon's every minute, evald status's) asks sbatch --test-only again.
    with pytest.raises(ExecutorMisconfigured) as again:
        typo.check()
    assert str(again.value) == said and ("sbatch", "--test-only") in typo.cli.calls
    assert typo.active() == []
    # Another config (the typo fixed) is not held back by this one's refusal.
    fixed = _executor(slurm_cluster, tmp_path / "jobs", name_prefix=typo.config.name_prefix)
    fixed.check()
    assert typo.refusal_path.exists()
    # The same config once Slurm takes its script (a feature added, say): the record goes.
    record = json.loads(typo.refusal_path.read_text())
    record["script"] = record["script"].replace("#SBATCH --constraint=a1000\n", "")
    typo.refusal_path.write_text(json.dumps(record))
    typo.check()
    assert not typo.refusal_path.exists()


def test_gpus_asked_of_a_cpu_partition_name_the_gpu_request(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    executor = _executor(slurm_cluster, tmp_path / "jobs")
    ref = JobRef(6, 1)
    with pytest.raises(ExecutorMisconfigured) as caught:
        executor.start(_spec_at(executor, ref, device="cuda"), ref)
    said = str(caught.value)
    assert said.startswith("executor.gpu_request: ") and "its nodes' GRES: none" in said
    assert "Invalid generic resource (gres) specification" in said
    assert "#SBATCH --gpus-per-node=1" in (executor.job_folder(ref) / "job.sbatch").read_text()


def test_a_retry_is_submitted_with_a_longer_time_limit(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    executor = _executor(slurm_cluster, tmp_path / "jobs", extra_sbatch=["--hold"], time_limit="1")
    ref = JobRef(7, 2)
    try:
        handle = executor.start(_spec_at(executor, ref), ref, Adjustments(time_limit_s=120))
        assert "#SBATCH --time=2\n" in (handle.job_dir / "job.sbatch").read_text()
        shown = executor.cli.show(handle.external_id)
        assert shown is not None and shown.time_limit_s == 120
    finally:
        _cancel(executor)


def test_the_only_node_is_not_excluded(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    executor = _executor(slurm_cluster, tmp_path / "jobs", extra_sbatch=["--hold"])
    ref = JobRef(8, 2)
    try:
        with capture_logs() as logs:
            handle = executor.start(
                _spec_at(executor, ref), ref, Adjustments(exclude=(slurm_cluster.node, "gone[1-2]"))
            )
        assert "--exclude" not in (handle.job_dir / "job.sbatch").read_text()
        (dropped,) = [e for e in logs if e["event"] == "slurm.exclude_dropped"]
        assert dropped["failed"] == [slurm_cluster.node]  # gone1, gone2: no longer in the partition
        assert "would keep 0 node(s) for a job of 1" in dropped["reason"]
        assert isinstance(executor.poll(handle), Active)
    finally:
        _cancel(executor)


def test_an_ended_submission_of_an_earlier_claim_is_not_found(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # A preempted job goes back to the queue under the same claim number, so its next submission has
    # the same name: one the daemon lost track of must never be taken for the ended one.
    executor = _executor(slurm_cluster, tmp_path / "jobs", extra_sbatch=["--hold"])
    ref = JobRef(9, 1)
    handle = executor.start(_spec_at(executor, ref), ref)
    executor.cancel(handle)
    wait_for(lambda: executor.cli.show(handle.external_id).finished or None, 60, "cancelled")  # type: ignore[union-attr]
    assert executor.find(ref) == handle
    later = time.time() + 30
    assert executor.find(ref, since=later) is None


def test_a_refused_job_waits_in_the_queue_and_a_reload_resumes_it(
    slurm_cluster: SlurmCluster,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in slurm_cluster.env.items():
        monkeypatch.setenv(name, value)
    dataset = write_dataset(tmp_path / "arith.jsonl", 4)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        slurm_cluster,
        dataset=dataset,
        executor_extra='extra_sbatch = ["--constraint=a1000", "--hold"]\nprobe_job_dir = false',
    )
    monkeypatch.setenv("PATH", daemon.env["PATH"])
    database = upgraded(sqlite_url)
    _one_ready_job(database, tmp_path / "run")
    config = load_config(daemon.config)
    try:
        runner = JobRunner(config, database, "host-a:1")
        with capture_logs() as logs:
            runner.settle(60)  # the executor's first check
            assert runner.claim_and_start()
            runner.settle(60)  # sbatch's answer
        (job,) = jobs(database)
        assert (job.state, job.attempts) == ("pending", 0) and runner.paused
        assert (runner.executor_unusable or "").startswith("executor.extra_sbatch: ")
        assert [e["event"] for e in logs if e["event"].startswith("executor.")] == ["executor.unusable"]
        with database.session() as session:
            (row,) = queries.job_history(session, job.id)
        assert (row.outcome, row.error_kind) == ("requeued", "executor_unusable")
        status = evald("--config", str(daemon.config), "status", env=daemon.env)
        assert status.returncode == 0 and "not submitting: executor.extra_sbatch" in status.stdout
        # A reload of the same config asks Slurm again (the fix may be the cluster's): still refused,
        # and no job is submitted for it.
        runner.reconfigure(config, planner=None, probe=None, alerter=None)
        runner.settle(60)
        assert runner.paused and daemon.sbatch_calls() == 1 + _test_only_calls(daemon)
        # The typo fixed and reloaded: the job is claimed again, under its first attempt.
        daemon.config.write_text(daemon.config.read_text().replace('"--constraint=a1000", ', ""))
        runner.reconfigure(load_config(daemon.config), planner=None, probe=None, alerter=None)
        runner.settle(60)
        assert not runner.paused
        assert runner.claim_and_start()
        runner.settle(60)
        (job,) = jobs(database)
        assert (job.state, job.attempts) == ("running", 1) and len(daemon.queue()) == 1
    finally:
        daemon.cancel_all()
        database.dispose()


def _test_only_calls(daemon: SlurmDaemon) -> int:
    lines = daemon.sbatch_log.read_text(encoding="utf-8").splitlines() if daemon.sbatch_log.exists() else []
    return len([line for line in lines if line.startswith("--test-only")])


def _one_ready_job(database: Database, root: Path, checkpoint: Path | None = None) -> None:
    folder = root / "step_10"
    if checkpoint is not None:
        copy_checkpoint(checkpoint, folder)
    else:
        folder.mkdir(parents=True)
    with database.session() as session:
        run_id = queries.ensure_run(session, "toy", str(root))
        made = queries.record_checkpoint(
            session,
            run_id=run_id,
            path=str(folder),
            name="step_10",
            step=10,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(session, checkpoint_id=made, step=10, tasks=["arith"])


# --- a two-node cluster that preempts, whose nodes can fail, with a partition's MaxTime ---------------


@dataclass(frozen=True)
class TwoNodeCluster(SlurmCluster):
    """Two slurmd (``n1``, ``n2``: one CPU each) on this host, beside the tests' cluster (other ports,
    its own munged), configured to preempt: see the module's docstring. Left running, like that one."""

    @property
    def nodes(self) -> tuple[str, str]:
        return ("n1", "n2")

    def write_config(self) -> None:
        prepare_root(self.root)
        host = socket.gethostname().split(".")[0]
        nodes = [
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={PRIVATE_PORT + 1 + i} CPUs=1 "
            f"RealMemory={self.memory_mb} State=UNKNOWN"
            for i, name in enumerate(self.nodes)
        ]
        partitions = [
            "PartitionName=low Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
            "PreemptMode=CANCEL",
            "PartitionName=high Nodes=n1,n2 MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF",
            "PartitionName=main Nodes=n1,n2 MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF",
            "PartitionName=short Nodes=n1,n2 MaxTime=2 State=UP PriorityTier=1 PreemptMode=OFF",
        ]
        text = conf_text(
            header="Written by tests/test_slurm_policy.py: two nodes on one host that preempt, for the "
            "retry policy's tests.",
            cluster_name="evald-policy",
            root=self.root,
            munge_socket=self.munge_socket,
            controller_port=PRIVATE_PORT,
            slurmd_port=PRIVATE_PORT + 1,
            slurmd_files="slurmd-%n",
            extra="PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n",
            nodes="\n".join([*nodes, *partitions]),
        )
        write_conf(self.conf, text)

    def _slurmd_pid(self, node: str) -> int | None:
        try:
            pid = int((self.root / "run" / f"slurmd-{node}.pid").read_text().strip())
            name = Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()).name
        except (OSError, ValueError):
            return None
        return pid if name == "slurmd" else None

    def start(self) -> None:
        if os.geteuid() != 0:
            raise ClusterUnavailable(f"slurmd must run as root (this is uid {os.geteuid()})")
        self.write_config()
        self._start_munged()
        self.start_controller()
        for node in self.nodes:
            if self._slurmd_pid(node) is None:
                self._spawn("slurmd", ["-D", "-f", str(self.conf), "-N", node])

        def idle() -> bool:
            done = self._client("sinfo", "-h", "-N", "-p", "main", "-o", "%N %T")
            states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
            for node, state in states.items():
                if state.rstrip("*~#") in {"down", "drained", "draining", "fail"}:
                    self._client("scontrol", "update", f"NodeName={node}", "State=RESUME")
            return len(states) == 2 and all(
                s.rstrip("*~#") in {"idle", "mixed", "allocated"} for s in states.values()
            )

        _wait_for(idle, "nodes n1 and n2 idle", self._log("slurmd-n1"))

    def resume(self, node: str) -> None:
        self._client("scontrol", "update", f"NodeName={node}", "State=RESUME")


#: The two-node cluster's controller port (its slurmd take the next two); not the tests' cluster's.
PRIVATE_PORT = 26817
PRIVATE_ROOT = Path("/tmp/evald-slurm-policy")


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[TwoNodeCluster]:
    try:
        for name in ("munged", "slurmctld", "slurmd", "sbatch"):
            _binary(name)
        cluster = TwoNodeCluster(
            root=PRIVATE_ROOT,
            node="n1",
            cpus=1,
            memory_mb=max(256, _memory_mb() // 4),
        )
        cluster.root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(cluster.root / ".start.lock"), timeout=120):
            cluster.start()
    except (ClusterUnavailable, OSError) as exc:
        if required():
            pytest.fail(f"no two-node Slurm cluster: {exc}")
        pytest.skip(f"no two-node Slurm cluster: {exc}")
    yield cluster
    for node in cluster.nodes:
        cluster.resume(node)


def _scontrol(cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["scontrol", *args], env=cluster.client_env(), capture_output=True, text=True, timeout=patient(60)
    )


def _sbatch(cluster: SlurmCluster, *args: str) -> str:
    done = subprocess.run(
        # Its output nowhere: a job of the tests' own would leave slurm-<id>.out in the working tree.
        ["sbatch", "--parsable", "--output=/dev/null", *args],
        env=cluster.client_env(),
        capture_output=True,
        text=True,
        timeout=patient(60),
        check=True,
    )
    return done.stdout.strip().split(";")[0]


def _running(daemon: SlurmDaemon) -> dict[str, str] | None:
    """The daemon's one job the controller runs now, with its node (``squeue``)."""
    done = subprocess.run(
        ["squeue", "-h", "-t", "RUNNING", "-o", "%i|%j|%N"],
        env=daemon.env,
        capture_output=True,
        text=True,
        timeout=patient(60),
    )
    for line in done.stdout.splitlines():
        job_id, name, node = line.split("|")
        if name.startswith(f"{daemon.prefix}-") and name != f"{daemon.prefix}-probe":
            return {"id": job_id, "name": name, "node": node}
    return None


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("slurm-policy-data") / "arith.jsonl", 4)


def _submitted_since(daemon: SlurmDaemon, before: int) -> Callable[[], bool | None]:
    return lambda: daemon.sbatch_calls() > before or None


def _waiting(tmp_path: Path) -> Path:
    setup = tmp_path / "setup.sh"
    setup.write_text(WAIT_FOR_GO, encoding="utf-8")
    return setup


@pytest.mark.long
def test_a_preempted_job_spends_no_attempt_until_its_free_preemptions_are_used(
    two_nodes: TwoNodeCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        two_nodes,
        dataset=dataset,
        partition="low",
        executor_extra=f'setup_script = "{_waiting(tmp_path)}"\nfree_preemptions = 1',
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    preemptors: list[str] = []
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            for _ in range(2):
                wait_for(lambda: _running(daemon), 120, "evald's job running", process.process)
                before = daemon.sbatch_calls()
                # A job of the higher partition wants both nodes: evald's is preempted.
                preemptors.append(_sbatch(two_nodes, "-p", "high", "--nodes=2", "--wrap", "sleep 600"))
                wait_for(_submitted_since(daemon, before), 120, "the job submitted again")
                subprocess.run(["scancel", preemptors[-1]], env=daemon.env, timeout=patient(60), check=True)
            (job,) = wait_for(
                lambda: [j for j in jobs(database) if j.state == "running"] or None, 60, "a claim"
            )
            running = wait_for(lambda: _running(daemon), 120, "evald's job running again", process.process)
            (daemon.job_dir / f"{job.id}-{job.attempts}" / "go").touch()
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            assert process.stop() == 0
    finally:
        for preemptor in preemptors:
            subprocess.run(["scancel", preemptor], env=daemon.env, timeout=patient(60))
        daemon.cancel_all()
    # The first preemption cost nothing (the job ran again as attempt 1); the second, past
    # free_preemptions = 1, spent one.
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 2)] and daemon.sbatch_calls() == 3
    assert running["name"] == f"{daemon.prefix}-{rows[0].id}-2"
    with database.session() as session:
        history = queries.job_history(session, rows[0].id)
    assert [(a.attempt, a.outcome, a.error_kind, a.exit_state) for a in history] == [
        (1, "requeued", "preempted", "PREEMPTED"),
        (1, "retried", "preempted", "PREEMPTED"),
        (2, "succeeded", None, "COMPLETED"),
    ]
    assert "preemption 1 in a row: back in evald's queue without spending an attempt" in (
        history[0].error or ""
    )
    assert "preemption 2 in a row, past executor.free_preemptions = 1" in (history[1].error or "")
    events = [
        json.loads(x)["event"]
        for x in (tmp_path / "daemon.log").read_text().splitlines()
        if x.startswith("{")
    ]
    assert events.count("job.preempted") == 1
    database.dispose()


@pytest.mark.long
def test_a_node_that_failed_is_kept_out_of_the_retry(
    two_nodes: TwoNodeCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        two_nodes,
        dataset=dataset,
        partition="main",
        executor_extra=f'setup_script = "{_waiting(tmp_path)}"',
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    failed = ""
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            first = wait_for(lambda: _running(daemon), 120, "evald's job running", process.process)
            failed = first["node"]
            down = _scontrol(two_nodes, "update", f"NodeName={failed}", "State=DOWN", "Reason=evald-test")
            assert down.returncode == 0, down.stderr
            (job,) = wait_for(
                lambda: [j for j in jobs(database) if j.attempts == 2 and j.state == "running"] or None,
                120,
                "a second attempt",
                process.process,
            )
            two_nodes.resume(failed)  # back in the partition: only the job's --exclude keeps it off
            second = wait_for(lambda: _running(daemon), 120, "the retry running", process.process)
            (daemon.job_dir / f"{job.id}-2" / "go").touch()
            rows = wait_for(lambda: all_jobs_done(database, 1), WAIT_S, "the job", process.process)
            assert process.stop() == 0
    finally:
        daemon.cancel_all()
        if failed:
            two_nodes.resume(failed)
    assert second["node"] != failed
    assert f"#SBATCH --exclude={failed}\n" in (daemon.job_dir / f"{job.id}-2" / "job.sbatch").read_text()
    assert [(j.state, j.attempts) for j in rows] == [("succeeded", 2)]
    with database.session() as session:
        history = queries.job_history(session, rows[0].id)
    assert [(a.outcome, a.error_kind, a.exit_state, a.nodes) for a in history] == [
        ("retried", "node_fail", "NODE_FAIL", failed),
        ("succeeded", None, "COMPLETED", second["node"]),
    ]
    assert f"node(s) {failed} are kept out of its next attempts" in (history[0].error or "")
    database.dispose()


@pytest.mark.long  # the two-node cluster's start
def test_a_time_limit_above_the_partitions_is_refused_and_the_most_is_within_it(
    two_nodes: TwoNodeCluster, tmp_path: Path
) -> None:
    over = _executor(two_nodes, tmp_path / "jobs", partition="short", time_limit="5")
    with pytest.raises(ExecutorError) as caught:
        over.check()
    assert str(caught.value).startswith(
        "executor.time_limit: 0:05:00 is more than partition 'short' allows (MaxTime 0:02:00)"
    )
    within = _executor(two_nodes, tmp_path / "jobs", partition="short", time_limit="1")
    assert within.max_time_limit_s == 240  # 4 × the limit until a check has read the partition
    within.check()
    assert within.time_limits() == (60, 120)


@pytest.mark.long
def test_a_timeout_is_retried_with_twice_the_time_and_fails_at_the_most(
    two_nodes: TwoNodeCluster, sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    # One minute, then two: the partition's MaxTime, below the default most (4 × the limit).
    daemon = slurm_config(
        tmp_path,
        sqlite_url,
        two_nodes,
        dataset=dataset,
        partition="short",
        time_limit="1",
        executor_extra=f'setup_script = "{_waiting(tmp_path)}"',
    )
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    try:
        with running_daemon(daemon.config, tmp_path / "daemon.log", daemon.env) as process:
            rows = wait_for(lambda: all_jobs_done(database, 1), 480, "the job", process.process)
            assert process.stop() == 0
    finally:
        daemon.cancel_all()
    (job,) = rows
    assert (job.state, job.attempts, job.error_kind) == ("failed", 2, "timeout")
    assert daemon.sbatch_calls() == 2
    assert "#SBATCH --time=2\n" in (daemon.job_dir / f"{job.id}-2" / "job.sbatch").read_text()
    with database.session() as session:
        history = queries.job_history(session, job.id)
    assert [(a.outcome, a.error_kind, a.exit_state) for a in history] == [
        ("retried", "timeout", "TIMEOUT"),
        ("failed", "timeout", "TIMEOUT"),
    ]
    assert "the next attempt gets 0:02:00 (--time=2)" in (history[0].error or "")
    # Not a third attempt at the same two minutes: failed, saying what to raise.
    assert "timed out at 0:02:00, the most a job may have" in (history[1].error or "")
    assert "raise executor.max_time_limit" in (history[1].error or "")
    database.dispose()
