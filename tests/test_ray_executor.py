"""The Ray executor (daemon/running/executors/ray.py) on the tests' local Ray cluster (tests/raycluster.py).

Beside the contract suite (tests/test_executor_contract.py runs on Ray too): the ``[executor.ray]``
section's checks; a job that waits for resources says so with what it waits for, is found by its name,
is adopted rather than submitted twice, and is cancelled; a head that does not answer is
"unavailable", not an error of the job; a driver interpreter that does not exist fails the job with a
line naming it; and a tp=2 job runs its ranks on the two worker nodes (gloo across Ray nodes) with the
single process's results.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from daemon.config import ExecutorConfig
from daemon.running.attempt import Verdict, verdict
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
from daemon.running.executors.local import LocalExecutor
from daemon.running.executors.ray import RayExecutor
from daemon.running.executors.ray_states import EXIT_NAME
from daemon.running.handover import read_end, write_folder
from inference.spec import JobSpec
from inference.toy.problems import held_out_problems, write_jsonl
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import Deadline
from tests.raycluster import RayCluster, ray_cluster
from tests.test_worker_group import group_spec

__all__ = ["ray_cluster"]

WAIT_S = 240.0


def _settings(job_dir: Path, address: str, **ray: object) -> ExecutorConfig:
    return ExecutorConfig.model_validate(
        {
            "kind": "ray",
            "job_dir": job_dir,
            "name_prefix": f"r{uuid.uuid4().hex[:8]}",
            "time_limit": "5",
            "ray": {
                "address": address,
                "driver_python": sys.executable,
                "env_vars": ["HF_HUB_OFFLINE"],
                **ray,
            },
        }
    )


def _start(executor: RayExecutor, spec: JobSpec, job_id: int, attempt: int = 1) -> tuple[JobSpec, Handle]:
    ref = JobRef(job_id, attempt, "toy", "arith")
    folder = executor.job_folder(ref)
    spec = spec.model_copy(update={"job_id": job_id, "result_path": folder / "result.json"})
    return spec, executor.start(write_folder(spec), ref)


def _until(executor: RayExecutor, handle: Handle, done: Callable[[object], bool], what: str) -> object:
    deadline = Deadline(WAIT_S)
    status: object = None
    while not deadline.expired():
        status = executor.poll(handle)
        if done(status):
            return status
        time.sleep(0.5)
    said = executor.jobs.logs(handle.external_id)[-2000:]
    raise AssertionError(f"Ray job {handle.external_id} never {what}; last: {status}; its log: {said}")


def _prefix_jobs(cluster: RayCluster, prefix: str) -> list[str]:
    """The Ray jobs of ``prefix``, counted with Ray's state API."""
    from ray.util.state import list_jobs

    return [
        j.submission_id
        for j in list_jobs(address=cluster.dashboard, detail=True)
        if (j.metadata or {}).get("evald") == prefix
    ]


# --- the section (no cluster) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"kind": "ray"}, 'job_dir\n  Value error, required when kind = "ray"'),
        ({"kind": "ray", "partition": "gpu"}, 'partition\n  Value error, applies only to kind = "slurm"'),
        ({"kind": "local", "ray": {"namespace": "x"}}, 'ray\n  Value error, applies only to kind = "ray"'),
        ({"kind": "ray", "ray": {"resources": {"GPU": 1}}}, "'GPU' is Ray's own: set num_cpus / num_gpus"),
        ({"kind": "ray", "ray": {"pip": ["x"], "conda": "y"}}, "pip or conda in one runtime_env"),
        ({"kind": "ray", "ray": {"address": "ftp://head"}}, "a Ray address is auto, ray://"),
        ({"kind": "ray", "ray": {"env_vars": ["A B"]}}, "not variable names: 'A B'"),
        ({"kind": "ray", "ray": {"placement_strategy": "ANYWHERE"}}, "ray.placement_strategy"),
        ({"kind": "ray", "ray": {"infeasible_timeout_secs": 0}}, "ray.infeasible_timeout_secs"),
    ],
)
def test_a_bad_ray_section_names_the_field(settings: dict[str, object], message: str, tmp_path: Path) -> None:
    if settings.get("kind") == "ray" and "job_dir" not in settings and settings != {"kind": "ray"}:
        settings = {**settings, "job_dir": tmp_path}
    with pytest.raises(ValidationError) as caught:
        ExecutorConfig.model_validate(settings)
    assert message in str(caught.value)
    # The good section beside it is taken.
    good = ExecutorConfig.model_validate(
        {"kind": "ray", "job_dir": tmp_path, "ray": {"address": "ray://h:10001"}}
    )
    assert good.ray.address == "ray://h:10001" and good.ray.placement_strategy == "STRICT_PACK"
    # An INFEASIBLE placement group waits 10 minutes unless told otherwise.
    assert good.ray.infeasible_timeout_secs == 600.0


def test_a_head_that_does_not_answer_is_unavailable_not_an_error_of_the_job(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    executor = RayExecutor(_settings(tmp_path, f"http://127.0.0.1:{port}"), python=sys.executable)
    with pytest.raises(ExecutorUnavailable, match=f"127.0.0.1:{port}"):
        executor.check()
    with pytest.raises(ExecutorUnavailable):
        executor.poll(Handle("ray", 1, 1, tmp_path / "1-1", "x-1-1"))


# --- on the cluster -------------------------------------------------------------------------------------


def test_a_job_waiting_for_resources_says_what_it_waits_for_is_found_adopted_and_cancelled(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, ray_cluster.address, resources={"evald_nowhere": 1})
    executor = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    spec, handle = _start(executor, spec, 201)

    status = _until(
        executor,
        handle,
        lambda s: isinstance(s, Active) and "placement group" in (s.reason or ""),
        "waited for its bundle",
    )
    assert isinstance(status, Active) and status.phase is Phase.PENDING
    assert status.reason is not None
    assert status.reason.startswith("waiting for resources: 1 bundle {CPU: 1, evald_nowhere: 1} (STRICT_PACK")
    # A daemon that never recorded the handle finds it by name; one that starts it again adopts it.
    restarted = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    found = restarted.find(JobRef(201, 1))
    again = restarted.start(spec.result_path.parent / "spec.json", JobRef(201, 1))
    assert found is not None and found.external_id == handle.external_id == again.external_id
    assert _prefix_jobs(ray_cluster, settings.name_prefix) == [handle.external_id]

    executor.cancel(handle)
    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")
    assert isinstance(ended, Ended) and ended.kind is EndKind.CANCELLED and "by evald" in ended.detail
    assert not spec.result_path.exists()
    # The driver, stopped while Ray placed its group, says so itself (not a SystemError out of ray.wait).
    record = spec.result_path.parent / EXIT_NAME
    deadline = Deadline(30)
    while not record.exists() and not deadline.expired():
        time.sleep(0.2)
    said = json.loads(record.read_text())
    assert (said["end"], said["detail"]) == ("cancelled", "stopped by SIGTERM (ray job stop)")
    # Ended before a later claim began: an earlier claim's, not found for it.
    assert restarted.find(JobRef(201, 1), since=time.time() + 60) is None


def test_a_driver_interpreter_that_does_not_exist_fails_the_job_with_a_line_naming_it(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, ray_cluster.address, driver_python="/nonexistent/python3")
    executor = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    spec, handle = _start(executor, spec, 202)

    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")
    assert isinstance(ended, Ended)
    outcome = read_end(spec, ended, detached=True)

    assert ended.kind is EndKind.FAILED
    assert "before its driver wrote an end" in ended.detail
    assert "/nonexistent/python3" in ended.log_tail
    assert outcome.error_kind == "crash" and "/nonexistent/python3" in (outcome.error or "")


def _gated_python(folder: Path) -> tuple[Path, Path]:
    """A driver interpreter that waits for its release file, then runs this one; and that file."""
    release = folder / "release"
    script = folder / "python-gated"
    script.write_text(
        f'#!/bin/sh\nwhile [ ! -e {release} ]; do sleep 0.2; done\nexec {sys.executable} "$@"\n'
    )
    script.chmod(0o755)
    return script, release


def _probe_answer(executor: RayExecutor, probe: Handle) -> bool:
    deadline = Deadline(WAIT_S)
    while not deadline.expired():
        answer = executor.probe_result(probe)
        if answer is not None:
            return answer
        time.sleep(0.5)
    raise AssertionError(
        f"probe job {probe.external_id} never ended: {executor.jobs.logs(probe.external_id)}"
    )


def test_the_job_folder_probe_reads_job_dir_and_the_other_folders_it_is_given(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """A task reads back the token written into job_dir and into an s3 run's cache_dir (made where
    missing). Where it cannot read the cache_dir's (gone while the probe's driver waited), the error
    names that folder and its run, not job_dir; the tokens are removed either way."""
    cache = tmp_path / "objects" / "cache"
    cloud = SharedFolder(cache, f"[runs.s3] cache_dir {cache} of run 'cloud'")
    (tmp_path / "jobs").mkdir()
    executor = RayExecutor(_settings(tmp_path / "jobs", ray_cluster.address), python=sys.executable)
    probe = executor.probe_job_dir([cloud])
    assert folder_probe.token_file(probe.job_dir, cache).is_file()
    assert _probe_answer(executor, probe) is True
    assert not probe.job_dir.exists() and list(cache.iterdir()) == []

    gated, release = _gated_python(tmp_path)
    (tmp_path / "held").mkdir()
    held = RayExecutor(
        _settings(tmp_path / "held", ray_cluster.address, driver_python=str(gated)), python=sys.executable
    )
    probe = held.probe_job_dir([cloud])
    token = folder_probe.token_file(probe.job_dir, cache)
    try:
        assert held.probe_result(probe) is None
        token.unlink()
        release.touch()
        with pytest.raises(ExecutorError) as caught:
            _probe_answer(held, probe)
    finally:
        release.touch()
    assert str(caught.value) == (
        f"[runs.s3] cache_dir {cache} of run 'cloud' is not shared with the Ray nodes: a task on "
        f"{socket.gethostname()} could not read {token}; put it on the filesystem the nodes share "
        "(as job_dir)"
    )
    assert list(cache.iterdir()) == [] and not probe.job_dir.exists()


@pytest.mark.long  # two toy evaluations (Ray tp=2 and local tp=1), ~40 s on 2 cores
def test_a_tp2_job_runs_a_rank_on_each_worker_node_with_the_single_process_results(
    ray_cluster: RayCluster, toy_run: ToyRun, tmp_path: Path
) -> None:
    dataset = tmp_path / "heldout.jsonl"
    write_jsonl(held_out_problems(4, seed=3), dataset)
    (tmp_path / "jobs").mkdir()
    # One rank a worker node: STRICT_SPREAD over bundles only the worker nodes hold.
    settings = _settings(
        tmp_path / "jobs",
        ray_cluster.address,
        placement_strategy="STRICT_SPREAD",
        resources={"evald_worker": 1},
    )
    executor = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    spec, handle = _start(
        executor, group_spec(toy_run.last_checkpoint, dataset, tmp_path / "x", tp=2, dp=1), 203
    )
    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")
    assert isinstance(ended, Ended) and ended.kind is EndKind.SUCCEEDED, ended
    outcome = read_end(spec, ended, detached=True)
    assert outcome.result is not None, outcome.error

    record = json.loads((handle.job_dir / "exit.json").read_text())
    ids = ray_cluster.node_ids()
    workers = {ids["a"], ids["b"]}
    assert len(set(record["node_ids"])) == 2 and set(record["node_ids"]) <= workers
    assert (handle.job_dir / "rank-0.log").exists() and (handle.job_dir / "rank-1.log").exists()

    local_config_dir = tmp_path / "local"
    from daemon.config import Config, DaemonConfig, RunConfig, TaskConfig

    config = Config(
        runs=(RunConfig(name="toy", root=local_config_dir / "run"),),
        tasks=(TaskConfig(name="arith", dataset=dataset),),
        daemon=DaemonConfig(state_dir=local_config_dir / "state"),
    )
    local = LocalExecutor(config, python=sys.executable)
    ref = JobRef(203, 1)
    one = group_spec(toy_run.last_checkpoint, dataset, tmp_path / "y", tp=1, dp=1)
    one = one.model_copy(update={"job_id": 203, "result_path": local.job_folder(ref) / "result.json"})
    local_handle = local.start(write_folder(one), ref)
    deadline = Deadline(WAIT_S)
    while isinstance(status := local.poll(local_handle), Active) and not deadline.expired():
        time.sleep(0.5)
    assert isinstance(status, Ended) and status.kind is EndKind.SUCCEEDED
    single = read_end(one, status, detached=False).result
    assert single is not None
    assert [s.response for s in outcome.result.samples] == [s.response for s in single.samples]
    assert {m.name: m.value for m in outcome.result.metrics if m.name == "accuracy"} == {
        m.name: m.value for m in single.metrics if m.name == "accuracy"
    }


def test_a_placement_group_past_its_timeout_ends_the_job_timeout_with_what_it_waited_for(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    settings = _settings(
        tmp_path, ray_cluster.address, resources={"evald_nowhere": 1}, placement_timeout_secs=2
    )
    executor = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    _, handle = _start(executor, spec, 204)

    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")

    assert isinstance(ended, Ended) and ended.kind is EndKind.TIMEOUT and ended.retryable
    assert "not placed within 2 s: 1 bundle {CPU: 1, evald_nowhere: 1} (STRICT_PACK" in ended.detail


def test_the_ray_client_address_and_the_dashboard_address_reach_the_same_cluster(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    for address in (ray_cluster.client_address, ray_cluster.dashboard):
        executor = RayExecutor(_settings(tmp_path, address), python=sys.executable, env=SUBPROCESS_ENV)
        # A ray:// address makes the head start a client server for the connection, which can fail to
        # start in time on a loaded head ("Starting Ray client server failed"): ExecutorUnavailable, which
        # the daemon meets by checking again later. Here too, a few times.
        for tries_left in reversed(range(3)):
            try:
                executor.check()
                break
            except ExecutorUnavailable:
                if not tries_left:
                    raise
                time.sleep(2)
        assert executor.jobs.dashboard_url == ray_cluster.dashboard


def test_a_placement_group_ray_says_is_infeasible_fails_the_job_past_its_limit_naming_what_it_asked(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """No node declares ``evald_nowhere``: Ray says the group is INFEASIBLE; the pending reason says since
    when and when the job fails; past ``infeasible_timeout_secs`` it ends ``infeasible``, which no retry
    follows (another attempt would ask the same) and which fails the job."""
    settings = _settings(
        tmp_path, ray_cluster.address, resources={"evald_nowhere": 1}, infeasible_timeout_secs=4
    )
    executor = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    spec, handle = _start(executor, spec, 205)

    waiting = _until(
        executor,
        handle,
        lambda s: isinstance(s, Ended) or "INFEASIBLE since" in (getattr(s, "reason", None) or ""),
        "said it is infeasible",
    )
    assert isinstance(waiting, Active) and waiting.phase is Phase.PENDING, waiting
    assert re.fullmatch(
        r"waiting for resources: 1 bundle \{CPU: 1, evald_nowhere: 1\} \(STRICT_PACK; placement group "
        r"INFEASIBLE since (\S+Z): no node can hold them, the job fails at (\S+Z)\)",
        waiting.reason or "",
    ), waiting.reason
    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")

    assert isinstance(ended, Ended) and ended.kind is EndKind.INFEASIBLE and not ended.retryable
    assert (
        f"Ray says the placement group {handle.external_id} is INFEASIBLE: no node of the cluster can hold "
        "1 bundle {CPU: 1, evald_nowhere: 1} (STRICT_PACK); gave up after 4 s of it "
        "(executor.ray.infeasible_timeout_secs)"
    ) in ended.detail
    outcome = read_end(spec, ended, detached=True)
    assert outcome.error_kind == "infeasible" and "evald_nowhere: 1" in (outcome.error or "")
    assert verdict("infeasible", batch_size=8, attempt=1, max_attempts=3, stopping=False, detached=True) is (
        Verdict.FAIL
    )
    assert not spec.result_path.exists()


_NODE = st.fixed_dictionaries(
    {
        "NodeName": st.sampled_from(["", "a", "b", "10.0.0.5", "192.0.2.2"]),
        "NodeManagerAddress": st.sampled_from(["", "10.0.0.5", "192.0.2.2"]),
    }
)


# No deadline: the first example imports ray (seconds), the rest take microseconds.
@settings(deadline=None)
@given(
    nodes=st.dictionaries(
        st.text(alphabet="0123456789abcdef", min_size=8, max_size=8).map(lambda head: head + "0" * 48),
        _NODE,
        min_size=1,
        max_size=6,
    ),
    unknown=st.integers(min_value=0, max_value=2),
)
def test_the_nodes_of_a_job_are_told_apart_whatever_ray_names_them(
    nodes: dict[str, dict[str, str]], unknown: int
) -> None:
    """A job's nodes as :func:`ray_driver.labels` names them (from ``ray.nodes()``): never two alike, each
    with its Ray name and address where it has them, and one Ray does not know by its id's digits."""
    pytest.importorskip("ray")
    from daemon.running.executors import ray_driver

    ids = [*nodes, *(f"{i:08x}" + "f" * 48 for i in range(unknown))]
    named = ray_driver.labels(ids, nodes)
    assert list(named) == ids and len(set(named.values())) == len(ids)
    for node_id, label in named.items():
        node = nodes.get(node_id, {})
        name, address = node.get("NodeName", ""), node.get("NodeManagerAddress", "")
        assert name in label and address in label
        if not name and not address:
            assert label == f"[node {node_id[:8]}]"
        elif list(named.values()).count(label) == 1 and "[node" not in label:
            assert label == (
                f"{name} ({address})" if name and address and name != address else name or address
            )


def test_a_failed_rank_names_its_node_as_ray_reports_it(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """The node a rank ran on is named as Ray's state API has it (its name and address), in the failure
    and in the job's node list: ``a (192.0.2.2)``, not an address alone that every node of a host shares."""
    from ray.util.state import list_nodes

    settings = _settings(tmp_path, ray_cluster.address, resources={"evald_node_a": 1})
    executor = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    # No checkpoint there: the worker exits non-zero at once.
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    _, handle = _start(executor, spec, 206)

    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")

    node_a = ray_cluster.node_ids()["a"]
    (ray_a,) = [n for n in list_nodes(address=ray_cluster.dashboard, detail=True) if n.node_id == node_a]
    label = f"{ray_a.node_name} ({ray_a.node_ip})"
    assert ray_a.node_name == "a" and label == f"a ({ray_a.node_ip})"
    assert isinstance(ended, Ended) and ended.kind is EndKind.FAILED, ended
    assert f"rank 0 on {label} exited status " in ended.detail, ended.detail
    assert ended.placement.nodes == label
    record = json.loads((handle.job_dir / EXIT_NAME).read_text())
    assert (record["nodes"], record["node_ids"]) == (label, [node_a])
