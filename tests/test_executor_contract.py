"""The executor contract (daemon/running/executors/base.py), one suite every executor passes.

Each test runs against every executor: ``local`` (worker processes of this process's), ``slurm`` (the
tests' one-host cluster of tests/slurmcluster.py; skipped where it cannot start) and ``ray`` (the local
Ray cluster of tests/raycluster.py). A job handed over is
polled until it ends and its result is collected; a job cancelled ends ``cancelled``; a fresh executor
(a daemon that restarted) re-attaches to a job by its handle and collects its result; a worker that dies
is reported as a crash with the cause its log names. Only the first test loads the toy model: the others
run a stand-in worker (a script given as the executor's Python) so that the suite stays short.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from daemon.config import Config, DaemonConfig, ExecutorConfig, RunConfig, TaskConfig
from daemon.running.executors.base import Active, Ended, EndKind, Executor, Handle, JobRef, Phase
from daemon.running.executors.local import LocalExecutor
from daemon.running.executors.ray import RayExecutor
from daemon.running.executors.slurm import SlurmExecutor
from daemon.running.handover import read_end, write_folder
from inference.spec import JobSpec
from inference.toy.problems import held_out_problems, write_jsonl
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import Deadline
from tests.forkserver import worker_python
from tests.raycluster import RayCluster, ray_cluster
from tests.slurmcluster import PARTITION, SlurmCluster, slurm_cluster
from tests.test_worker_group import group_spec

__all__ = ["ray_cluster", "slurm_cluster"]

pytestmark = pytest.mark.slow

#: Seconds a test waits for a job to reach a state (a toy job runs in ~10 s of CPU here).
WAIT_S = 240.0

#: A stand-in for ``python -m inference.worker SPEC``: ``crash`` dies as a segfaulting process does;
#: ``wait`` says it waits (a file ``waiting``), waits for a file ``go`` in its folder, then writes a result
#: of one metric.
STAND_IN = """\
import sys
import time
from pathlib import Path

from inference.spec import JobResult, JobSpec, MetricValue

mode, spec_path = sys.argv[1], Path(sys.argv[-1])
if mode == "crash":
    print("Fatal Python error: Segmentation fault", file=sys.stderr, flush=True)
    sys.exit(7)
spec = JobSpec.model_validate_json(spec_path.read_bytes())
(spec_path.parent / "waiting").touch()
while not (spec_path.parent / "go").exists():
    time.sleep(0.2)
JobResult(job_id=spec.job_id, metrics=(MetricValue(name="accuracy", value=0.5, n=2),)).write(spec.result_path)
"""

#: Makes an executor whose worker is run by the given Python (None: the real one).
Make = Callable[[str | None], Executor]


def _stand_in(folder: Path, mode: str) -> str:
    """A script to give an executor as its Python: it runs :data:`STAND_IN` in ``mode``."""
    folder.mkdir(parents=True, exist_ok=True)
    worker = folder / "stand_in.py"
    worker.write_text(STAND_IN, encoding="utf-8")
    script = folder / f"python-{mode}"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} {worker} {mode} "$@"\n', encoding="utf-8")
    script.chmod(0o755)
    return str(script)


@pytest.fixture(params=["local", "slurm", "ray"])
def make(request: pytest.FixtureRequest, tmp_path: Path, dataset: Path) -> Iterator[Make]:
    made: list[Executor] = []
    if request.param == "local":
        config = Config(
            runs=(RunConfig(name="toy", root=tmp_path / "run"),),
            tasks=(TaskConfig(name="arith", dataset=dataset),),
            daemon=DaemonConfig(state_dir=tmp_path / "state"),
        )

        def local(python: str | None) -> Executor:
            executor = LocalExecutor(config, python=python or worker_python())
            made.append(executor)
            return executor

        yield local
    elif request.param == "slurm":
        cluster: SlurmCluster = request.getfixturevalue("slurm_cluster")
        folder = tmp_path / "jobs"
        folder.mkdir()
        settings = ExecutorConfig.model_validate(
            {
                "kind": "slurm",
                "partition": PARTITION,
                "job_dir": folder,
                # Each test its own prefix: find() must not see another test's jobs.
                "name_prefix": f"c{uuid.uuid4().hex[:8]}",
                "time_limit": "5",
            }
        )

        def slurm(python: str | None) -> Executor:
            executor = SlurmExecutor(
                settings, python=python or worker_python(), env={**SUBPROCESS_ENV, **cluster.env}
            )
            made.append(executor)
            return executor

        yield slurm
    elif request.param == "ray":
        ray_cluster: RayCluster = request.getfixturevalue("ray_cluster")
        folder = tmp_path / "jobs"
        folder.mkdir()
        ray_settings = ExecutorConfig.model_validate(
            {
                "kind": "ray",
                "job_dir": folder,
                "name_prefix": f"c{uuid.uuid4().hex[:8]}",
                "time_limit": "5",
                "poll_secs": 1,
                # The driver needs ray: the test's own interpreter, whatever runs the ranks.
                "ray": {
                    "address": ray_cluster.address,
                    "driver_python": sys.executable,
                    "env_vars": ["HF_HUB_OFFLINE"],
                },
            }
        )

        def on_ray(python: str | None) -> Executor:
            executor = RayExecutor(ray_settings, python=python or sys.executable, env=SUBPROCESS_ENV)
            made.append(executor)
            return executor

        yield on_ray
    # Nothing left queued or running: the node's CPUs are the next test's.
    for executor in made:
        if isinstance(executor, SlurmExecutor):
            for _, job in executor.active():
                executor.cli.cancel(job.job_id)
        if isinstance(executor, RayExecutor):
            for _, ray_job in executor.active():
                executor.jobs.stop(ray_job.submission_id)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("contract-data") / "heldout.jsonl"
    write_jsonl(held_out_problems(4, seed=1), path)
    return path


def _start(executor: Executor, spec: JobSpec, job_id: int) -> tuple[JobRef, JobSpec, Handle]:
    """What the runner does: the spec in the job's folder, then ``start``."""
    ref = JobRef(job_id, 1, "toy", "arith")
    folder = executor.job_folder(ref)
    spec = spec.model_copy(update={"job_id": job_id, "result_path": folder / "result.json"})
    return ref, spec, executor.start(write_folder(spec), ref)


def _toy_spec(toy_run: ToyRun, dataset: Path, tmp_path: Path) -> JobSpec:
    return group_spec(toy_run.last_checkpoint, dataset, tmp_path / "unused", tp=1, dp=1)


def _until(executor: Executor, handle: Handle, done: Callable[[object], bool], what: str) -> object:
    deadline = Deadline(WAIT_S)
    status: object = None
    while not deadline.expired():
        status = executor.poll(handle)
        if done(status):
            return status
        time.sleep(0.3)
    log = handle.job_dir / "worker.log"
    said = log.read_text(errors="replace")[-2000:] if log.exists() else "(no worker.log)"
    raise AssertionError(f"{handle.executor} job {handle.external_id} never {what}; last: {status}; {said}")


def _ended(executor: Executor, handle: Handle) -> Ended:
    status = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")
    assert isinstance(status, Ended)
    return status


def test_a_job_handed_over_is_polled_to_its_end_and_its_result_collected(
    make: Make, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    executor = make(None)
    ref, spec, handle = _start(executor, _toy_spec(toy_run, dataset, tmp_path), 101)

    assert (handle.executor, handle.job_id, handle.attempt) == (executor.kind, 101, 1)
    assert handle.job_dir == executor.job_folder(ref)
    assert Handle.from_json(handle.to_json()) == handle
    ended = _ended(executor, handle)

    assert ended.kind is EndKind.SUCCEEDED
    outcome = read_end(spec, ended, detached=executor.detached)
    assert outcome.result is not None, f"{outcome.error_kind}: {outcome.error}"
    assert {m.name for m in outcome.result.metrics} >= {"accuracy"}
    assert len(outcome.result.samples) == 4


def test_a_cancelled_job_ends_cancelled_without_a_result(make: Make, tmp_path: Path) -> None:
    executor = make(_stand_in(tmp_path / "bin", "wait"))
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    _, spec, handle = _start(executor, spec, 102)
    _until(executor, handle, lambda s: isinstance(s, Active) and s.phase is Phase.RUNNING, "ran")

    executor.cancel(handle)
    ended = _ended(executor, handle)

    assert ended.kind is EndKind.CANCELLED
    assert "by evald" in ended.detail
    assert read_end(spec, ended, detached=executor.detached).result is None
    assert not spec.result_path.exists()


def test_a_restarted_daemon_reattaches_by_the_handle_and_collects_the_result(
    make: Make, tmp_path: Path
) -> None:
    python = _stand_in(tmp_path / "bin", "wait")
    first = make(python)
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    ref, spec, handle = _start(first, spec, 103)
    _until(first, handle, lambda s: isinstance(s, Active) and s.phase is Phase.RUNNING, "ran")
    # Past its start (the shell's exec, the imports): a daemon restarts long after its worker started.
    _until(first, handle, lambda s: (spec.result_path.parent / "waiting").exists(), "waiting")

    # The daemon restarts: a new executor, the handle as the database stored it.
    second = make(python)
    stored = Handle.from_json(handle.to_json())
    running = second.poll(stored)
    found = second.find(ref)
    (spec.result_path.parent / "go").touch()
    ended = _ended(second, stored)

    assert isinstance(running, Active) and running.phase is Phase.RUNNING
    # A scheduler's job outlives its daemon and is found by name; a worker here dies with its daemon.
    assert (found.external_id if found is not None else None) == (
        handle.external_id if second.detached else None
    )
    assert ended.kind is EndKind.SUCCEEDED
    outcome = read_end(spec, ended, detached=second.detached)
    assert outcome.result is not None, f"{outcome.error_kind}: {outcome.error}"
    assert [(m.name, m.value) for m in outcome.result.metrics] == [("accuracy", 0.5)]


def test_a_worker_that_dies_is_reported_as_a_crash_with_its_cause(make: Make, tmp_path: Path) -> None:
    executor = make(_stand_in(tmp_path / "bin", "crash"))
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    _, spec, handle = _start(executor, spec, 104)

    ended = _ended(executor, handle)
    outcome = read_end(spec, ended, detached=executor.detached)

    assert ended.kind is EndKind.FAILED and ended.exit_code == 7
    assert outcome.result is None
    assert outcome.error_kind == "crash"
    assert "Fatal Python error: Segmentation fault" in outcome.error.splitlines()[0]
