"""The Ray executor's GPU ranks (``[executor.ray] num_gpus``) on a cluster whose worker node declares two
GPUs this host does not have (``ray start --num-gpus 2``: Ray believes it, hands the ids 0 and 1 to tasks
that ask for GPUs and sets their ``CUDA_VISIBLE_DEVICES``) — the edge that cannot run here, the rest real.

The inference device stays ``cpu``: ray.py takes a rank's GPUs from ``num_gpus`` and its device from the
spec, so the ranks hold the declared GPUs and compute on the CPU (``DS_ACCELERATOR=cpu``). A tp=2 job
packed on the GPU node succeeds, each rank shown both of the node's GPUs in one ``CUDA_VISIBLE_DEVICES``
list with its own at its ``LOCAL_RANK`` (the first line of its log says both); a job asking more GPUs
than the cluster has waits, its reason naming the GPUs, and is cancelled.

The shared cluster has no GPUs (its tests rely on that), so this module starts a private one: a head and
one worker node ``gpu`` (2 GPUs, 2 CPUs); ``long``, as the cluster start alone takes tens of seconds.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.running.executors.base import Active, Ended, EndKind, Phase
from daemon.running.executors.ray import RayExecutor
from daemon.running.handover import read_end
from inference.toy.problems import held_out_problems, write_jsonl
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.raycluster import RayCluster, private_cluster
from tests.test_ray_executor import _settings, _start, _until
from tests.test_worker_group import group_spec

pytestmark = pytest.mark.long

#: The first line run_rank writes to a rank's log (ray_driver.py).
FIRST_LINE = re.compile(
    r"evald: rank (?P<rank>\d+) on Ray node (?P<node>[0-9a-f]+) \(.*\), "
    r"CUDA_VISIBLE_DEVICES=(?P<devices>\S*) LOCAL_RANK=(?P<local>\d+) ray_gpu_ids=(?P<own>\S+)$"
)


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    root = Path(f"/tmp/evald-ray-gpus-{tmp_path_factory.getbasetemp().name}")
    # The head declares no GPUs, whatever the host has: the GPU node is the only one with any.
    with private_cluster(root, workers=("gpu",), gpus={"head": 0, "gpu": 2}) as cluster:
        yield cluster


def _first_line(log: Path) -> re.Match[str]:
    line = log.read_text(errors="replace").splitlines()[0]
    match = FIRST_LINE.match(line)
    assert match is not None, f"{log}'s first line does not name its devices: {line!r}"
    return match


def test_a_tp2_job_on_the_gpu_node_gives_both_ranks_its_two_gpus_each_at_its_local_rank(
    gpu_cluster: RayCluster, toy_run: ToyRun, tmp_path: Path
) -> None:
    dataset = tmp_path / "heldout.jsonl"
    write_jsonl(held_out_problems(2, seed=3), dataset)
    (tmp_path / "jobs").mkdir()
    settings = _settings(tmp_path / "jobs", gpu_cluster.address, num_gpus=1)
    executor = RayExecutor(settings, python=sys.executable, env=SUBPROCESS_ENV)
    spec = group_spec(toy_run.last_checkpoint, dataset, tmp_path / "x", tp=2, dp=1)
    assert spec.inference.device == "cpu"
    spec, handle = _start(executor, spec, 301)

    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")
    assert isinstance(ended, Ended) and ended.kind is EndKind.SUCCEEDED, ended
    outcome = read_end(spec, ended, detached=True)
    assert outcome.result is not None, outcome.error

    # What was asked: a GPU a rank, packed on one node, computing on the CPU.
    asked = json.loads((handle.job_dir / "ray_job.json").read_text())
    assert asked["bundles"] == [{"CPU": 1, "GPU": 1}] * 2 and asked["strategy"] == "STRICT_PACK"
    assert asked["env"] == {"DS_ACCELERATOR": "cpu"}
    gpu_node = gpu_cluster.node_ids()["gpu"]
    assert json.loads((handle.job_dir / "exit.json").read_text())["node_ids"] == [gpu_node, gpu_node]

    # What each rank was given: the node's two GPUs in one list, its own at its LOCAL_RANK.
    ranks = [_first_line(handle.job_dir / f"rank-{r}.log") for r in (0, 1)]
    assert [int(m["rank"]) for m in ranks] == [0, 1]
    assert {m["node"] for m in ranks} == {gpu_node}
    devices = {m["devices"] for m in ranks}
    assert len(devices) == 1, f"the ranks saw different CUDA_VISIBLE_DEVICES: {devices}"
    listed = devices.pop().split(",")
    assert sorted(listed) == ["0", "1"]
    assert sorted(int(m["local"]) for m in ranks) == [0, 1]
    # Each rank computes on the GPU Ray gave it (cuda:LOCAL_RANK of the list), not a peer's.
    assert [listed[int(m["local"])] for m in ranks] == [m["own"] for m in ranks]


def test_a_job_asking_more_gpus_than_the_cluster_has_waits_naming_them_and_is_cancelled(
    gpu_cluster: RayCluster, tmp_path: Path
) -> None:
    executor = RayExecutor(
        _settings(tmp_path, gpu_cluster.address, num_gpus=3), python=sys.executable, env=SUBPROCESS_ENV
    )
    spec = group_spec(tmp_path / "ckpt", tmp_path / "data.jsonl", tmp_path / "unused", tp=1, dp=1)
    spec, handle = _start(executor, spec, 302)

    status = _until(
        executor,
        handle,
        lambda s: isinstance(s, Active) and "placement group" in (s.reason or ""),
        "waited for its bundle",
    )
    assert isinstance(status, Active) and status.phase is Phase.PENDING
    assert status.reason is not None
    assert status.reason.startswith("waiting for resources: 1 bundle {CPU: 1, GPU: 3} (STRICT_PACK"), status

    executor.cancel(handle)
    ended = _until(executor, handle, lambda s: isinstance(s, Ended), "ended")
    assert isinstance(ended, Ended) and ended.kind is EndKind.CANCELLED and "by evald" in ended.detail
    assert not spec.result_path.exists()
