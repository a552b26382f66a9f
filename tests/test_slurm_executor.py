"""SlurmExecutor against a real one-host Slurm cluster (tests/slurmcluster.py): no mock anywhere.

Jobs are the real worker on the session's toy model, submitted with ``sbatch`` and read back from the
job folder; the scheduler's outcomes are produced for real (``scancel`` from outside, a one-minute time
limit, slurmctld stopped and started mid-job). A job that must stay running for a while waits in its
setup script (``[executor] setup_script``, which a cluster uses to load modules) for a file the test
writes, so the test decides when it goes on.

Skipped with a message where no cluster can be started, unless ``EVALD_REQUIRE_SLURM=1``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.config import ExecutorConfig
from daemon.running.executors import folder_probe
from daemon.running.executors.base import (
    Active,
    Ended,
    EndKind,
    ExecutorError,
    ExecutorUnavailable,
    Handle,
    JobRef,
    Phase,
    SharedFolder,
)
from daemon.running.executors.slurm import SlurmExecutor
from daemon.running.executors.slurm_cli import SlurmCli
from daemon.running.workers import read_outcome
from inference.spec import EXIT_INPUT_ERROR, JobResult, JobSpec
from inference.toy.problems import held_out_problems, write_jsonl
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import Deadline
from tests.forkserver import worker_python
from tests.slurmcluster import PARTITION, SlurmCluster, slurm_cluster
from tests.test_worker_group import evaluated, group_spec, outputs, run_group

__all__ = ["slurm_cluster"]

pytestmark = pytest.mark.slow

#: Seconds a test waits for a job to reach a state (a toy job runs in ~10 s of CPU here).
WAIT_S = 240.0
#: Metrics that are the same wherever the worker runs (the timings are not).
STABLE = ("accuracy", "response_length", "truncation_rate")
WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.2; done\n"


def make_executor(cluster: SlurmCluster, folder: Path, **settings: Any) -> SlurmExecutor:
    folder.mkdir(parents=True, exist_ok=True)
    config = ExecutorConfig.model_validate(
        {
            "kind": "slurm",
            "partition": PARTITION,
            "job_dir": folder,
            # Each test its own prefix: find() and active() must not see another test's jobs.
            "name_prefix": f"t{uuid.uuid4().hex[:8]}",
            "time_limit": "5",
            **settings,
        }
    )
    return SlurmExecutor(config, python=worker_python(), env={**SUBPROCESS_ENV, **cluster.env})


@pytest.fixture
def executor(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[SlurmExecutor]:
    made = make_executor(slurm_cluster, tmp_path / "jobs")
    yield made
    _cancel_all(made)


def _cancel_all(executor: SlurmExecutor) -> None:
    """Leave no job queued or running: the node's two CPUs are the next test's."""
    for _, job in executor.active():
        executor.cli.cancel(job.job_id)


@pytest.fixture
def waiting_script(tmp_path: Path) -> Path:
    script = tmp_path / "setup.sh"
    script.write_text(WAIT_FOR_GO, encoding="utf-8")
    return script


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("slurm-data") / "heldout.jsonl"
    write_jsonl(held_out_problems(8, seed=1), path)
    return path


@pytest.fixture(scope="module")
def local_result(toy_run: ToyRun, dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    """The reference: the same job run by the local executor's way (one worker process here)."""
    folder = tmp_path_factory.mktemp("local") / "job"
    spec = group_spec(toy_run.last_checkpoint, dataset, folder, tp=1, dp=1)
    return evaluated(run_group(spec), folder)


def write_spec(executor: SlurmExecutor, ref: JobRef, spec: JobSpec) -> Path:
    """What the runner does before ``start``: the spec in the job's folder, its result beside it."""
    folder = executor.job_folder(ref)
    folder.mkdir(parents=True, exist_ok=True)
    spec = spec.model_copy(update={"job_id": ref.job_id, "result_path": folder / "result.json"})
    path = folder / "spec.json"
    path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
    return path


def toy_spec(toy_run: ToyRun, dataset: Path, tmp_path: Path, *, tp: int = 1) -> JobSpec:
    return group_spec(toy_run.last_checkpoint, dataset, tmp_path / "unused", tp=tp, dp=1)


def wait_until(executor: SlurmExecutor, handle: Handle, done: Any, what: str, wait_s: float = WAIT_S) -> Any:
    deadline = Deadline(wait_s)
    status: Any = None
    while not deadline.expired():
        status = executor.poll(handle)
        if done(status):
            return status
        time.sleep(0.5)
    log = handle.job_dir / "worker.log"
    said = log.read_text(errors="replace")[-2000:] if log.exists() else "(no worker.log)"
    raise AssertionError(f"Slurm job {handle.external_id} never {what}; last: {status}; log: {said}")


def ended(executor: SlurmExecutor, handle: Handle, wait_s: float = WAIT_S) -> Ended:
    status = wait_until(executor, handle, lambda s: isinstance(s, Ended), "ended", wait_s)
    assert isinstance(status, Ended)
    return status


def running(executor: SlurmExecutor, handle: Handle) -> Active:
    status = wait_until(
        executor, handle, lambda s: not (isinstance(s, Active) and s.phase is Phase.PENDING), "started"
    )
    assert isinstance(status, Active) and status.phase is Phase.RUNNING, status
    return status


def stable(result: JobResult) -> dict[str, tuple[float, int | None]]:
    return {m.name: (m.value, m.n) for m in result.metrics if m.name in STABLE}


def test_a_toy_job_through_slurm_gives_the_local_result(
    executor: SlurmExecutor,
    slurm_cluster: SlurmCluster,
    toy_run: ToyRun,
    dataset: Path,
    local_result: JobResult,
    tmp_path: Path,
) -> None:
    ref = JobRef(job_id=41, attempt=1, run="grpo/7b run", task="toy")
    spec_path = write_spec(executor, ref, toy_spec(toy_run, dataset, tmp_path))

    handle = executor.start(spec_path, ref)
    end = ended(executor, handle)

    assert end.kind is EndKind.SUCCEEDED, end
    assert end.exit_code == 0
    assert end.detail.startswith(f"Slurm job {handle.external_id} COMPLETED after 0:")
    assert end.placement.nodes == slurm_cluster.node
    assert end.placement.queue_wait_s is not None and end.placement.run_s is not None
    result = JobResult.read(handle.job_dir / "result.json")
    assert outputs(result) == outputs(local_result)
    assert stable(result) == stable(local_result)
    assert (handle.job_dir / "slurm_job_id").read_text().strip() == handle.external_id
    # A single rank is started by srun too, so that srun's options (a container) apply to it.
    assert "\nsrun --ntasks=1 --ntasks-per-node=1 " in (handle.job_dir / "job.sbatch").read_text()
    assert '"exit_code": 0' in (handle.job_dir / "exit.json").read_text()
    assert (
        f"evald: slurm job {handle.external_id} on {slurm_cluster.node}"
        in (handle.job_dir / "worker.log").read_text()
    )
    # The comment carries the run, and brings the job back to the same handle.
    shown = executor.cli.show(handle.external_id)
    assert shown is not None and executor.parse_comment(shown.comment) == JobRef(41, 1, run="grpo/7b run")
    assert executor.find(ref) == handle
    # No accounting on this cluster: squeue/scontrol and the folder suffice.
    assert executor.cli.accounting(handle.external_id) is None

    # Once the controller has forgotten a job (MinJobAge), its folder still says how it ended.
    forgotten = Handle("slurm", 41, 1, handle.job_dir, "999999")
    assert executor.poll(forgotten) == Ended(
        EndKind.SUCCEEDED,
        "Slurm job 999999 is no longer known to the controller; its script exited 0",
        exit_code=0,
    )
    empty = executor.job_folder(JobRef(42, 1))
    empty.mkdir()
    lost = executor.poll(Handle("slurm", 42, 1, empty, "999998"))
    assert isinstance(lost, Ended) and lost.kind is EndKind.LOST and lost.retryable
    assert "no longer known to the controller" in lost.detail


def test_a_rejected_checkpoint_fails_with_the_workers_error(
    executor: SlurmExecutor, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    checkpoint = Path(shutil.copytree(toy_run.last_checkpoint, tmp_path / "checkpoint"))
    (checkpoint / "config.json").write_text('{"model_type": "llama",', encoding="utf-8")
    ref = JobRef(job_id=43, attempt=2)
    spec = toy_spec(toy_run, dataset, tmp_path).model_copy(update={"checkpoint_path": checkpoint})
    spec_path = write_spec(executor, ref, spec)

    handle = executor.start(spec_path, ref)
    end = ended(executor, handle)

    assert (end.kind, end.exit_code) == (EndKind.FAILED, EXIT_INPUT_ERROR)
    assert end.detail.endswith("exit status 3")
    assert "evald worker: checkpoint_invalid:" in end.log_tail
    # The runner's reader of a worker's folder reads a Slurm job's the same.
    written = JobSpec.model_validate_json(spec_path.read_bytes())
    outcome = read_outcome(written, EXIT_INPUT_ERROR, handle.job_dir / "worker.log")
    assert outcome.error_kind == "checkpoint_invalid"
    assert "config.json is not valid JSON" in outcome.error


def test_a_pending_job_has_its_reason_and_evald_cancels_it(
    slurm_cluster: SlurmCluster, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    executor = make_executor(slurm_cluster, tmp_path / "jobs", extra_sbatch=["--hold"], max_queued_per_run=1)
    ref = JobRef(job_id=44, attempt=1, run="a")
    handle = executor.start(write_spec(executor, ref, toy_spec(toy_run, dataset, tmp_path)), ref)
    try:
        status = executor.poll(handle)
        assert status == Active(Phase.PENDING, "JobHeldUser", status.placement)
        assert status.placement.nodes == "" and status.placement.started is None
        # The queue as squeue --json lists it, and as the fallback format does, says the same.
        by_json = next(j for j in executor.cli.queue() if j.job_id == handle.external_id)
        plain = SlurmCli(executor.cli._env, json_output=False)
        by_format = next(j for j in plain.queue() if j.job_id == handle.external_id)
        shown = executor.cli.show(handle.external_id)
        assert shown is not None
        for job in (by_json, by_format):
            assert (job.state, job.reason, job.name, job.comment, job.partition) == (
                shown.state,
                shown.reason,
                shown.name,
                shown.comment,
                shown.partition,
            )
        assert plain.calls == [("squeue", "-h", "-t", "all", "-o", plain_format())]
        # One job of run "a" queued: the per-run limit is reached for it, not for run "b".
        assert [r.job_id for r, _ in executor.active()] == [44]
        assert not executor.room("a") and executor.room("b")
    finally:
        executor.cancel(handle)

    end = ended(executor, handle)
    assert end.kind is EndKind.CANCELLED
    assert end.detail == f"Slurm job {handle.external_id} cancelled by evald while pending"
    assert executor.active() == [] and executor.room("a")


def plain_format() -> str:
    from daemon.running.executors.slurm_output import SQUEUE_FORMAT

    return SQUEUE_FORMAT


def test_scancel_from_outside_is_cancelled(
    slurm_cluster: SlurmCluster, waiting_script: Path, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    executor = make_executor(slurm_cluster, tmp_path / "jobs", setup_script=waiting_script)
    ref = JobRef(job_id=45, attempt=1)
    handle = executor.start(write_spec(executor, ref, toy_spec(toy_run, dataset, tmp_path)), ref)
    try:
        assert running(executor, handle).placement.nodes == slurm_cluster.node
        subprocess.run(["scancel", handle.external_id], check=True, env=slurm_cluster.client_env())
        end = ended(executor, handle)
    finally:
        _cancel_all(executor)

    assert end.kind is EndKind.CANCELLED and not end.retryable
    assert end.detail.startswith(f"Slurm job {handle.external_id} cancelled outside evald (scancel) after 0:")
    assert not (handle.job_dir / "result.json").exists()


@pytest.mark.long
def test_a_job_past_its_time_limit_is_a_timeout(
    slurm_cluster: SlurmCluster, waiting_script: Path, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    """Slurm's limits are whole minutes: this test waits a minute (asleep, no CPU)."""
    executor = make_executor(slurm_cluster, tmp_path / "jobs", setup_script=waiting_script, time_limit="1")
    ref = JobRef(job_id=46, attempt=1)
    handle = executor.start(write_spec(executor, ref, toy_spec(toy_run, dataset, tmp_path)), ref)
    try:
        end = ended(executor, handle)
    finally:
        _cancel_all(executor)

    assert end.kind is EndKind.TIMEOUT and end.retryable
    assert end.detail.startswith(f"Slurm job {handle.external_id} TIMEOUT after 0:01:")
    assert end.detail.endswith(f"on {slurm_cluster.node} (limit 0:01:00)")
    assert "#SBATCH --time=1" in (handle.job_dir / "job.sbatch").read_text()


def test_a_bad_partition_is_named_with_the_partitions_there_are(
    slurm_cluster: SlurmCluster, executor: SlurmExecutor, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    bad = make_executor(slurm_cluster, tmp_path / "bad-jobs", partition="gpu-h100")
    ref = JobRef(job_id=47, attempt=1)
    expected = "executor.partition: Slurm has no partition 'gpu-h100' (its partitions: debug)"

    with pytest.raises(ExecutorError) as caught:
        bad.check()
    assert str(caught.value) == expected
    with pytest.raises(ExecutorError) as caught:
        bad.start(write_spec(bad, ref, toy_spec(toy_run, dataset, tmp_path)), ref)
    assert str(caught.value).startswith(f"{expected}; sbatch said: ")
    assert "invalid partition specified: gpu-h100" in str(caught.value)

    # Beside it, a good executor's job runs as ever.
    executor.check()
    good = JobRef(job_id=48, attempt=1)
    handle = executor.start(write_spec(executor, good, toy_spec(toy_run, dataset, tmp_path)), good)
    assert ended(executor, handle).kind is EndKind.SUCCEEDED


def test_a_submission_never_recorded_is_found_and_a_double_cancelled(
    slurm_cluster: SlurmCluster, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    """The daemon died after sbatch and before recording the id, twice for the same attempt: a new
    daemon adopts the first submission and cancels the second, submitting nothing."""
    first = make_executor(slurm_cluster, tmp_path / "jobs", extra_sbatch=["--hold"])
    ref = JobRef(job_id=49, attempt=3, run="r")
    spec_path = write_spec(first, ref, toy_spec(toy_run, dataset, tmp_path))
    script = spec_path.parent / "job.sbatch"
    script.write_text(first.batch_script(JobSpec.model_validate_json(spec_path.read_bytes()), spec_path, ref))
    submitted = [first.cli.submit(script), first.cli.submit(script)]
    assert not (spec_path.parent / "slurm_job_id").exists()

    after_restart = SlurmExecutor(
        first._config, python=sys.executable, env={**SUBPROCESS_ENV, **slurm_cluster.env}
    )
    try:
        handle = after_restart.find(ref)
        assert handle == Handle("slurm", 49, 3, spec_path.parent, submitted[0])
        assert after_restart.find(JobRef(job_id=49, attempt=4)) is None
        double = ended(after_restart, Handle("slurm", 49, 3, spec_path.parent, submitted[1]))
        assert double.detail == f"Slurm job {submitted[1]} cancelled by evald while pending"
        assert isinstance(after_restart.poll(handle), Active)
        assert not any(call[0] == "sbatch" for call in after_restart.cli.calls)
    finally:
        _cancel_all(after_restart)


@pytest.mark.long
def test_slurmctld_restarted_mid_job(
    slurm_cluster: SlurmCluster,
    waiting_script: Path,
    toy_run: ToyRun,
    dataset: Path,
    local_result: JobResult,
    tmp_path: Path,
) -> None:
    executor = make_executor(slurm_cluster, tmp_path / "jobs", setup_script=waiting_script)
    ref = JobRef(job_id=50, attempt=1)
    handle = executor.start(write_spec(executor, ref, toy_spec(toy_run, dataset, tmp_path)), ref)
    try:
        running(executor, handle)
        slurm_cluster.stop_controller()
        with pytest.raises(ExecutorUnavailable, match="slurmctld does not answer"):
            executor.poll(handle)
        with pytest.raises(ExecutorUnavailable, match="slurmctld does not answer"):
            executor.find(ref)
        # The job goes on under slurmd while the controller is away.
        (handle.job_dir / "go").touch()
        slurm_cluster.start_controller()
        end = ended(executor, handle)
    finally:
        if not slurm_cluster.controller_answers():
            slurm_cluster.start_controller()
        _cancel_all(executor)

    assert end.kind is EndKind.SUCCEEDED, end
    assert outputs(JobResult.read(handle.job_dir / "result.json")) == outputs(local_result)


@pytest.mark.long
def test_a_tp2_job_runs_as_two_slurm_tasks_over_gloo(
    slurm_cluster: SlurmCluster, toy_run: ToyRun, dataset: Path, local_result: JobResult, tmp_path: Path
) -> None:
    # The ranks meet on the interface named (here lo, the one-host cluster's), through srun's options.
    executor = make_executor(
        slurm_cluster, tmp_path / "jobs-lo", rendezvous_interface="lo", srun_options=["--mpi=none"]
    )
    ref = JobRef(job_id=51, attempt=1)
    spec_path = write_spec(executor, ref, toy_spec(toy_run, dataset, tmp_path, tp=2))

    handle = executor.start(spec_path, ref)
    # The first CPU group on a machine compiles DeepSpeed's shared-memory all-reduce op (minutes on two
    # busy cores; torch keeps it in ~/.cache/torch_extensions after that).
    end = ended(executor, handle, wait_s=900)

    assert end.kind is EndKind.SUCCEEDED, f"{end}\n{end.log_tail}"
    script = (handle.job_dir / "job.sbatch").read_text()
    assert "#SBATCH --ntasks=2" in script and "srun --ntasks=2" in script and " --mpi=none " in script
    assert "evald: rendezvous 127.0.0.1:" in (handle.job_dir / "worker.log").read_text()
    assert "export GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo" in script
    result = JobResult.read(handle.job_dir / "result.json")
    assert outputs(result) == outputs(local_result)
    assert result.consistency is not None and result.consistency.batches_checked > 0
    assert '"task.loaded"' in (handle.job_dir / "rank-1.log").read_text()


def test_a_cluster_already_up_is_reused(slurm_cluster: SlurmCluster) -> None:
    from tests.slurmcluster import ensure_cluster

    daemons = ("munged", "slurmctld", "slurmd")
    before = [slurm_cluster._pid(d) for d in daemons]

    again = ensure_cluster(slurm_cluster.root)

    assert None not in before
    assert [again._pid(d) for d in daemons] == before
    assert again.partitions() == [PARTITION] and again.node_state() in {"idle", "mixed", "allocated"}


def wait_probe(executor: SlurmExecutor, probe: Handle) -> bool:
    deadline = Deadline(WAIT_S)
    while not deadline.expired():
        answer = executor.probe_result(probe)
        if answer is not None:
            return answer
        time.sleep(0.5)
    raise AssertionError(f"probe job {probe.external_id} never ended")


def test_the_job_folder_probe(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A job on a compute node reads back a token written into job_dir. Where the node cannot read it
    (here: the token is gone before the held probe is released), the error names the folder and node."""
    executor = make_executor(slurm_cluster, tmp_path / "jobs")
    probe = executor.probe_job_dir()
    assert wait_probe(executor, probe) is True
    assert not probe.job_dir.exists()

    held = make_executor(slurm_cluster, tmp_path / "unshared", extra_sbatch=["--hold"])
    probe = held.probe_job_dir()
    try:
        assert held.probe_result(probe) is None
        (probe.job_dir / "token").unlink()
        subprocess.run(["scontrol", "release", probe.external_id], check=True, env=slurm_cluster.client_env())
        with pytest.raises(ExecutorError) as caught:
            wait_probe(held, probe)
    finally:
        _cancel_all(held)
    assert str(caught.value) == (
        f"executor.job_dir {tmp_path / 'unshared'} is not shared with the compute nodes: a job on "
        f"{slurm_cluster.node} could not read {probe.job_dir / 'token'} (mount the folder there, or pick "
        "one that is)"
    )


def test_the_job_folder_probe_reads_the_other_folders_it_is_given_in_the_same_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """An s3 run's cache_dir (made where missing) gets the probe's token too, read back by the same job.
    Where the node cannot read it (the token gone before the held probe is released), the error names
    that folder and its run, not job_dir; the tokens are removed either way."""
    cache = tmp_path / "objects" / "cache"
    cloud = SharedFolder(cache, f"[runs.s3] cache_dir {cache} of run 'cloud'")
    other = SharedFolder(tmp_path / "other", f"[runs.s3] cache_dir {tmp_path / 'other'} of run 'other'")
    executor = make_executor(slurm_cluster, tmp_path / "jobs")
    probe = executor.probe_job_dir([cloud, other])
    assert folder_probe.token_file(probe.job_dir, cache).is_file()
    assert wait_probe(executor, probe) is True
    assert not probe.job_dir.exists() and list(cache.iterdir()) == list(other.path.iterdir()) == []

    held = make_executor(slurm_cluster, tmp_path / "held", extra_sbatch=["--hold"])
    probe = held.probe_job_dir([other, cloud])
    token = folder_probe.token_file(probe.job_dir, cache)
    try:
        assert held.probe_result(probe) is None
        token.unlink()
        subprocess.run(["scontrol", "release", probe.external_id], check=True, env=slurm_cluster.client_env())
        with pytest.raises(ExecutorError) as caught:
            wait_probe(held, probe)
    finally:
        held.cli.cancel(probe.external_id)
    assert str(caught.value) == (
        f"[runs.s3] cache_dir {cache} of run 'cloud' is not shared with the compute nodes: a job on "
        f"{slurm_cluster.node} could not read {token}; put it on the filesystem the nodes share (as job_dir)"
    )
    assert list(cache.iterdir()) == list(other.path.iterdir()) == []


def test_a_rendezvous_interface_the_node_lacks_fails_the_job_at_once_naming_it(
    slurm_cluster: SlurmCluster, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    executor = make_executor(slurm_cluster, tmp_path / "jobs", rendezvous_interface="nope0")
    ref = JobRef(job_id=52, attempt=1)
    handle = executor.start(write_spec(executor, ref, toy_spec(toy_run, dataset, tmp_path, tp=2)), ref)

    end = ended(executor, handle, wait_s=60)

    assert end.kind is EndKind.FAILED and end.exit_code == 1, end
    said = f"evald: executor.rendezvous_interface nope0 has no IPv4 address on {slurm_cluster.node}"
    assert said in end.log_tail
    assert not (handle.job_dir / "rank-0.log").exists()  # no rank was started
