"""The driver of one evald job on a Ray cluster: it reserves the ranks' placement group, starts one rank
a bundle, and writes how the job ended into the job folder.

This file runs on the cluster, not in the daemon: :mod:`.ray` copies it into the job folder
(``ray_driver.py``, beside ``ray_job.json`` which says what to run) and submits it as the Ray job's
entrypoint, so it imports nothing but ``ray`` and the standard library. It

1. writes ``ray_state.json`` ``{"phase": "placing"}`` and creates the placement group (tp × dp bundles,
   named like the job, in the configured namespace), updating the file with the group's scheduling state
   while it waits for resources (and since when Ray says it is INFEASIBLE: past
   ``infeasible_timeout_s`` the job ends ``infeasible``);
2. asks bundle 0's node for a free port: the rendezvous (``MASTER_ADDR``, ``MASTER_PORT``) is there;
3. starts one Ray task a rank in its bundle, each running ``python -m inference.worker spec.json`` as a
   child process (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` set for a group of more
   than one; its output in ``rank-<N>.log``, or ``worker.log`` for a job of one rank, after a first line
   naming its node and, where set, its ``CUDA_VISIBLE_DEVICES``, ``LOCAL_RANK`` and Ray's GPU ids), tied
   to the task by ``EVALD_PARENT_PID``, and writes ``ray_state.json`` ``{"phase": "running"}``;
4. waits for them: the first rank that fails ends the others (as ``srun --kill-on-bad-exit``), as does
   the time limit, a SIGTERM (``ray job stop``) or a node that dies;
5. writes ``exit.json``: ``exit_code``, ``end`` (succeeded, failed, node_fail, out_of_memory, timeout,
   infeasible, lost, cancelled), ``detail``, the failed ``rank``, the ``nodes`` (as Ray names them: ``a
   (10.0.0.5)``); and exits with the worker's status.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

EXIT_NAME = "exit.json"
STATE_NAME = "ray_state.json"
LOG_NAME = "worker.log"
DRIVER_LOG = "driver.log"
#: The variable that ties a worker to the process that started it (inference.spec.PARENT_PID_ENV).
PARENT_PID_ENV = "EVALD_PARENT_PID"
#: Ray's scheduling state of a placement group no node of the cluster can hold as it is.
INFEASIBLE = "INFEASIBLE"
#: Seconds between looks at a placement group that waits for resources.
PLACING_POLL_S = 2.0
#: Seconds of one wait for the ranks: a signal is handled between two.
WAIT_SLICE_S = 0.5
#: Digits of a Ray node id that tell nodes of one address apart in messages.
ID_CHARS = 8
#: A rank's variables its log's first line shows, where set: they decide the GPU it computes on.
DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK")


#: Set by a SIGTERM (``ray job stop``): the waits end the job as cancelled between two slices. Raising in
#: the handler itself would surface inside Ray's own call under way, as a SystemError.
STOPPED = threading.Event()


class Ended(Exception):
    """How the job ended, when not by its ranks' own exit."""

    def __init__(self, end: str, detail: str, code: int | None = None, rank: int | None = None) -> None:
        super().__init__(detail)
        self.end, self.detail, self.code, self.rank = end, detail, code, rank


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def say(folder: Path, line: str) -> None:
    """One line to the Ray job's log and to ``driver.log`` in the folder."""
    text = f"evald ray driver: {line}"
    print(text, flush=True)
    try:
        with (folder / DRIVER_LOG).open("a", encoding="utf-8") as out:
            out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n")
    except OSError:
        pass


@ray.remote(num_cpus=0)
def rendezvous() -> tuple[str, int]:
    """Bundle 0's node address and a port free on it now."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        port = int(probe.getsockname()[1])
    address: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return address, port


@ray.remote(max_retries=0)
def run_rank(command: list[str], env: dict[str, str], log_path: str, cwd: str) -> tuple[int, str]:
    """Run one rank's worker as a child of this task's process; its exit status and Ray node id."""
    child_env = {**os.environ, **env, PARENT_PID_ENV: str(os.getpid())}
    mine: list[str] = []
    if "_GPU_LOCAL" in env:
        # The node's GPUs of this job in one list, each rank at its own index: ranks on one node see
        # each other's devices, as under torchrun.
        mine = [str(int(g)) for g in ray.get_gpu_ids()]
        shared = env["_GPU_LOCAL"].split(",")
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(shared)
        if mine and mine[0] in shared:
            child_env["LOCAL_RANK"] = str(shared.index(mine[0]))
        child_env.pop("_GPU_LOCAL", None)
    node: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    with Path(log_path).open("ab") as out:
        # Where the rank runs, first in its log: a bundle may have moved since the driver looked; and the
        # devices it was given, which decide the GPU it computes on.
        node_id = ray.get_runtime_context().get_node_id()
        shown = [f"{name}={child_env[name]}" for name in DEVICE_VARS if name in child_env]
        if mine:
            shown.append(f"ray_gpu_ids={','.join(mine)}")
        where = f"evald: rank {env.get('RANK', '0')} on Ray node {node_id} ({node})"
        out.write(f"{where}{', ' + ' '.join(shown) if shown else ''}\n".encode())
        out.flush()
        process = subprocess.Popen(
            command, env=child_env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd
        )
    try:
        return process.wait(), node_id
    finally:
        if process.poll() is None:
            process.kill()


@ray.remote(num_cpus=0)
def bundle_gpus() -> list[str]:
    return [str(int(g)) for g in ray.get_gpu_ids()]


def place(job: dict[str, Any], folder: Path) -> PlacementGroup:
    """The job's placement group, once Ray placed all its bundles."""
    selector = job.get("label_selector") or None
    group: PlacementGroup = placement_group(
        job["bundles"],
        strategy=job["strategy"],
        name=job["name"],
        bundle_label_selector=[selector] * len(job["bundles"]) if selector else None,
    )
    started = time.time()
    limit = job.get("placement_timeout_s")
    bundles = describe_bundles(job["bundles"])
    infeasible: float | None = None
    while True:
        ready, _ = ray.wait([group.ready()], timeout=PLACING_POLL_S)
        if STOPPED.is_set():
            ray.util.remove_placement_group(group)
            raise cancelled()
        if ready:
            ray.get(ready[0])
            return group
        table = placement_group_table(group)
        scheduling = str((table.get("stats") or {}).get("scheduling_state") or table.get("state") or "")
        # Since when Ray says no node can hold the bundles (a node that could may join: it counts anew).
        infeasible = (infeasible or time.time()) if scheduling == INFEASIBLE else None
        write_json(
            folder / STATE_NAME,
            {
                "phase": "placing",
                "since": started,
                "bundles": bundles,
                "scheduling": scheduling,
                "infeasible_since": infeasible,
                "infeasible_timeout_s": job.get("infeasible_timeout_s"),
            },
        )
        if limit is not None and time.time() - started > float(limit):
            ray.util.remove_placement_group(group)
            raise Ended(
                "timeout",
                f"placement group {job['name']} not placed within {limit:g} s: {bundles} "
                f"({job['strategy']}; {scheduling})",
            )
        give_up_infeasible(job, group, bundles, infeasible)


def give_up_infeasible(job: dict[str, Any], group: PlacementGroup, bundles: str, since: float | None) -> None:
    """:class:`Ended` ``infeasible`` once Ray has said INFEASIBLE for ``infeasible_timeout_s`` in a row."""
    limit = job.get("infeasible_timeout_s")
    if since is None or limit is None or time.time() - since <= float(limit):
        return
    ray.util.remove_placement_group(group)
    raise Ended(
        "infeasible",
        f"Ray says the placement group {job['name']} is INFEASIBLE: no node of the cluster can hold "
        f"{bundles} ({job['strategy']}); gave up after {float(limit):g} s of it "
        "(executor.ray.infeasible_timeout_secs): ask for what the nodes have, or add such a node",
    )


def describe_bundles(bundles: list[dict[str, float]]) -> str:
    """``2 bundles {CPU: 1}``: what the job waits for."""
    kinds: dict[str, int] = {}
    for bundle in bundles:
        text = "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(bundle.items())) + "}"
        kinds[text] = kinds.get(text, 0) + 1
    return ", ".join(f"{n} bundle{'s' if n > 1 else ''} {text}" for text, n in kinds.items())


def start_ranks(job: dict[str, Any], folder: Path, group: PlacementGroup) -> list[Any]:
    world = int(job["world_size"])
    table = placement_group_table(group)
    nodes = [str(table["bundles_to_node_id"][i]) for i in range(world)]

    def in_bundle(index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)

    env = dict(job.get("env") or {})
    gpus: dict[str, list[str]] = {}
    if float(job["rank_options"].get("num_gpus") or 0) > 0:
        options = {**job["rank_options"]}
        found = ray.get(
            [bundle_gpus.options(**options, scheduling_strategy=in_bundle(i)).remote() for i in range(world)]
        )
        for node, ids in zip(nodes, found, strict=True):
            gpus.setdefault(node, []).extend(i for i in ids if i not in gpus.get(node, []))
    refs = []
    if world > 1:
        addr, port = ray.get(rendezvous.options(scheduling_strategy=in_bundle(0)).remote())
        env.update(MASTER_ADDR=addr, MASTER_PORT=str(port), WORLD_SIZE=str(world))
        say(folder, f"rendezvous at {addr}:{port}")
    for rank in range(world):
        rank_env = dict(env)
        log = folder / LOG_NAME
        if world > 1:
            peers = [r for r in range(world) if nodes[r] == nodes[rank]]
            rank_env.update(
                RANK=str(rank),
                LOCAL_RANK=str(peers.index(rank)),
                LOCAL_WORLD_SIZE=str(len(peers)),
                LOCAL_SIZE=str(len(peers)),
            )
            log = folder / f"rank-{rank}.log"
        if nodes[rank] in gpus:
            rank_env["_GPU_LOCAL"] = ",".join(gpus[nodes[rank]])
        refs.append(
            run_rank.options(**job["rank_options"], scheduling_strategy=in_bundle(rank)).remote(
                job["command"], rank_env, str(log), str(folder)
            )
        )
    return refs


def wait_ranks(refs: list[Any], time_limit: float | None, names: dict[str, str]) -> tuple[int, list[str]]:
    """The group's exit status once every rank exited 0, or :class:`Ended` at the first that did not
    (``names``: node id → the node as :func:`node_names` says it)."""
    started = time.time()
    pending = list(refs)
    where: list[str] = []
    while pending:
        # Short waits: a SIGTERM (ray job stop) is handled between them.
        done, pending = ray.wait(pending, num_returns=1, timeout=WAIT_SLICE_S)
        if STOPPED.is_set():
            stop(pending + done)
            raise cancelled()
        if not done:
            if time_limit is not None and time.time() - started > time_limit:
                stop(pending)
                raise Ended("timeout", f"time limit {time_limit:g} s reached: the ranks were stopped")
            continue
        rank = refs.index(done[0])
        try:
            code, node = ray.get(done[0])
        except ray.exceptions.OutOfMemoryError as exc:
            stop(pending)
            raise Ended(
                "out_of_memory", f"rank {rank} killed by Ray's memory monitor: {first(exc)}", rank=rank
            ) from exc
        except ray.exceptions.NodeDiedError as exc:
            stop(pending)
            raise Ended("node_fail", f"rank {rank}'s node died: {first(exc)}", rank=rank) from exc
        except ray.exceptions.RayError as exc:
            stop(pending)
            raise Ended("lost", f"rank {rank} lost: {type(exc).__name__}: {first(exc)}", rank=rank) from exc
        node = names.get(node, node)
        where.append(node)
        if code != 0:
            stop(pending)
            raise Ended("failed", f"rank {rank} on {node} exited {describe(code)}", code=code, rank=rank)
    return 0, where


def cancelled() -> Ended:
    return Ended("cancelled", "stopped by SIGTERM (ray job stop)")


def stop(refs: list[Any]) -> None:
    for ref in refs:
        # A rank already gone needs no stopping.
        with contextlib.suppress(Exception):
            ray.cancel(ref, force=True)


def first(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__


def describe(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"status {code}"


def node_list(group: PlacementGroup | None) -> str:
    """The job's nodes, each once, as :func:`node_names` says them (``a (10.0.0.5), b (10.0.0.6)``)."""
    ids = list(dict.fromkeys(node_ids(group)))
    names = node_names(ids)
    return ", ".join(names.get(i, i[:ID_CHARS]) for i in ids)


def node_names(ids: list[str]) -> dict[str, str]:
    """Node id → the node as Ray reports it (:func:`labels`); empty where Ray does not say."""
    try:
        known = {n["NodeID"]: n for n in ray.nodes()}  # type: ignore[no-untyped-call]
    except Exception:  # the names are a courtesy
        return {}
    return labels(ids, known)


def labels(ids: list[str], known: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each node of ``ids`` as ``known`` (``ray.nodes()`` by node id) has it: its name and address
    (``a (10.0.0.5)``), or its address alone where its name is that address (Ray's default); where nodes
    of ``ids`` share a label (one host, several nodes) or have none, each id's first digits after it."""
    said = {}
    for node_id in dict.fromkeys(ids):
        node = known.get(node_id) or {}
        address, name = str(node.get("NodeManagerAddress") or ""), str(node.get("NodeName") or "")
        said[node_id] = f"{name} ({address})" if name and address and name != address else name or address
    shared = [label for label in said.values() if list(said.values()).count(label) > 1]
    return {
        node_id: f"{label} [node {node_id[:ID_CHARS]}]".strip() if not label or label in shared else label
        for node_id, label in said.items()
    }


def node_ids(group: PlacementGroup | None) -> list[str]:
    """The Ray node of each bundle, in rank order."""
    if group is None:
        return []
    try:
        table = placement_group_table(group)["bundles_to_node_id"]
        return [str(table[i]) for i in sorted(table)]
    except Exception:  # the node ids are a courtesy
        return []


def main(argv: list[str]) -> int:
    job_path = Path(argv[1])
    job = json.loads(job_path.read_text(encoding="utf-8"))
    folder = job_path.parent
    begun = time.time()
    group: PlacementGroup | None = None

    def terminated(_signum: int, _frame: object) -> None:
        STOPPED.set()

    record: dict[str, Any]
    try:
        ray.init(namespace=job["namespace"], log_to_driver=False)
        # After ray.init, which installs handlers of its own.
        signal.signal(signal.SIGTERM, terminated)
        say(folder, f"job {job['name']}: {job['world_size']} rank(s), {describe_bundles(job['bundles'])}")
        write_json(
            folder / STATE_NAME,
            {"phase": "placing", "since": begun, "bundles": describe_bundles(job["bundles"])},
        )
        group = place(job, folder)
        refs = start_ranks(job, folder, group)
        names = node_names(node_ids(group))
        nodes = node_list(group)
        state = {"phase": "running", "since": time.time(), "nodes": nodes, "node_ids": node_ids(group)}
        write_json(folder / STATE_NAME, state)
        say(folder, f"ranks started on {nodes}")
        code, _ = wait_ranks(refs, job.get("time_limit_s"), names)
        record = {"end": "succeeded", "exit_code": code, "detail": "every rank exited 0", "rank": None}
    except Ended as ended:
        record = {"end": ended.end, "exit_code": ended.code, "detail": ended.detail, "rank": ended.rank}
    except Exception as exc:  # whatever stops the driver is the job's end
        record = {"end": "lost", "exit_code": None, "detail": f"driver: {type(exc).__name__}: {first(exc)}"}
        if STOPPED.is_set():
            # Stopped inside a call no wait covers (starting the ranks): still a cancellation.
            record.update(end="cancelled", detail=cancelled().detail)
        record["rank"] = None
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    record.update(
        nodes=node_list(group), node_ids=node_ids(group), started=begun, ended=time.time(), name=job["name"]
    )
    write_json(folder / EXIT_NAME, record)
    say(folder, f"ended {record['end']}: {record['detail']}")
    code = record["exit_code"]
    return 0 if record["end"] == "succeeded" else (code if isinstance(code, int) and 0 < code < 256 else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
