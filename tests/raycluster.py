"""A local Ray cluster of the tests' own: a head and two worker nodes, each a ``ray start --block`` process.

The head (``--num-cpus=1``, the dashboard and its Jobs API on loopback) and the workers ``a`` and ``b``
(``--num-cpus=1`` each, told apart by the custom resources ``evald_node_a`` / ``evald_node_b``, and
named ``head``, ``a``, ``b`` with ``--node-name``) all run on this host, on free ports, with small
object stores. Ray registers every node under the host's own address, whatever ``--node-ip-address``
says (it resolves loopback to the address the host reaches out by: 192.0.2.2 in this sandbox), so their
names are what tells them apart where evald shows a job's nodes (``a (192.0.2.2)``). Each node is its own
process group, started with ``--block`` so that stopping it (SIGTERM to its ``ray start``) stops what it
started, and killing it (SIGKILL to the group) is a node that dies. Nothing else of Ray on this machine
is touched: no ``ray stop`` (it stops every Ray process of the host). A module's private cluster (a
:class:`RayCluster` of its own root) may name other worker nodes, and nodes that declare GPUs this host
does not have (``RayCluster(root, workers=("gpu",), gpus={"gpu": 2})``): :func:`private_cluster`; the
shared one has none.

The cluster is shared by the test processes of one session (xdist workers): the first to need it starts
it under a lock and records its ports and pids in ``<root>/cluster.json``; each process registers
itself for the module that uses it, and the last to leave stops it. Skipped where Ray is not installed, unless
``EVALD_REQUIRE_RAY=1`` (CI): then it fails. Run as a script to start or stop it by hand::

    python -m tests.raycluster start     # or: stop, status
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from filelock import FileLock

from tests.deadlines import patient
from tests.processes import alive, free_port, kill_tree, spawn, tail, tree, wait_until

REQUIRE_ENV = "EVALD_REQUIRE_RAY"
ROOT_ENV = "EVALD_RAY_ROOT"
DEFAULT_ROOT = Path("/tmp/evald-ray")
START_TIMEOUT_S = 120.0
#: Bytes of each node's object store: the jobs pass nothing through it.
OBJECT_STORE_BYTES = 80 * 1024 * 1024
WORKERS = ("a", "b")


class RayUnavailable(RuntimeError):
    """Ray is not installed, or a node would not start (the message says which)."""


def _ray_binary() -> str:
    path = Path(sys.executable).with_name("ray")
    if not path.exists():
        raise RayUnavailable(f"no {path}: install the dev extra (pip install -e '.[dev]'), which brings ray")
    return str(path)


@dataclass
class RayCluster:
    root: Path
    gcs_port: int = 0
    dashboard_port: int = 0
    client_port: int = 0
    #: Node name (``head``, ``a``, ``b``) → the pid (and process group) of its ``ray start --block``.
    pids: dict[str, int] = field(default_factory=dict)
    #: The worker nodes :meth:`start` starts after the head.
    workers: tuple[str, ...] = WORKERS
    #: Node name → the GPUs it declares (``ray start --num-gpus``: Ray believes it and hands their ids
    #: to tasks, whether or not the host has them; 0: none, whatever the host has), and as many CPUs
    #: (one a GPU rank), at least 1. A node not named declares 1 CPU and leaves GPUs to Ray's own
    #: detection, as the shared cluster's nodes do.
    gpus: dict[str, int] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """The GCS address (``ray start --address``, and a valid ``[executor.ray] address``)."""
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def client_address(self) -> str:
        return f"ray://127.0.0.1:{self.client_port}"

    # --- state shared between the session's processes ----------------------------------------------

    @property
    def _record(self) -> Path:
        return self.root / "cluster.json"

    def save(self) -> None:
        data = {
            "gcs": self.gcs_port,
            "dashboard": self.dashboard_port,
            "client": self.client_port,
            "pids": self.pids,
        }
        self._record.write_text(json.dumps(data), encoding="utf-8")

    def load(self) -> bool:
        try:
            data = json.loads(self._record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        self.gcs_port, self.dashboard_port, self.client_port = data["gcs"], data["dashboard"], data["client"]
        self.pids = {k: int(v) for k, v in data["pids"].items()}
        return True

    # --- nodes -----------------------------------------------------------------------------------

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        self._log(name).parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            # A worker node whose head is gone gives up soon (a head restart in the tests).
            "RAY_gcs_rpc_server_reconnect_timeout_s": "20",
        }
        env.pop("RAY_ADDRESS", None)
        command = [
            _ray_binary(),
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            f"--node-name={name}",
        ]
        self.pids[name] = spawn([*command, *args], self._log(name), env).pid

    def _log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.out"

    def _shape(self, name: str) -> list[str]:
        """What node ``name`` declares: its CPUs, and its GPUs where :attr:`gpus` names it."""
        if name not in self.gpus:
            return ["--num-cpus=1"]
        gpus = self.gpus[name]
        return [f"--num-cpus={max(1, gpus)}", f"--num-gpus={gpus}"]

    def start_head(self) -> None:
        if not self.gcs_port:
            self.gcs_port, self.dashboard_port, self.client_port = free_port(), free_port(), free_port()
        self._spawn(
            "head",
            [
                "--head",
                f"--port={self.gcs_port}",
                *self._shape("head"),
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard_port}",
                f"--ray-client-server-port={self.client_port}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
                f"--temp-dir={self.root / 'head'}",
                '--resources={"evald_head": 1}',
            ],
        )
        self.save()
        self._wait(self.jobs_api_answers, "the head's Jobs API", "head")

    def start_worker(self, name: str) -> None:
        self._spawn(
            name,
            [
                f"--address={self.address}",
                *self._shape(name),
                # evald_worker: what a test's ranks ask for to land on worker nodes only.
                f'--resources={{"evald_node_{name}": 1, "evald_worker": 1}}',
                f"--dashboard-agent-listen-port={free_port()}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
            ],
        )
        self.save()
        self._wait(lambda: name in self.live_nodes(), f"worker node {name} to join", name)

    def start(self) -> None:
        self.start_head()
        for name in self.workers:
            self.start_worker(name)

    def kill_node(self, name: str) -> None:
        """SIGKILL the node's whole process group: a node that dies (its raylet, agents and workers)."""
        pid = self.pids.pop(name, None)
        if pid is not None:
            # The tree is read first: a process in a session of its own (a job's driver) is out of the
            # group, and once its parents die it is no longer under the node's pid.
            kill_tree(pid, signal.SIGKILL, tree(pid))
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.save()

    def stop_node(self, name: str) -> None:
        """Stop a node as ``systemctl stop`` would (SIGTERM to its ``ray start --block``), then its group."""
        pid = self.pids.pop(name, None)
        if pid is None:
            return
        known = tree(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        wait_until(lambda: not alive(pid), 10, interval=0.2)
        kill_tree(pid, signal.SIGKILL, known)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        self.save()

    def stop(self) -> None:
        """Kill every node (:meth:`kill_node`): the cluster is the tests' own and nothing of it is kept. A
        ``ray start --block`` given SIGTERM outlived :meth:`stop_node`'s 10 s wait, and the session's end
        waited about that long on it."""
        for name in [*self.workers, "head"]:
            self.kill_node(name)

    def restart(self) -> None:
        """The head restarted (a new cluster: Ray without an external GCS store forgets its jobs), and
        the worker nodes with it."""
        for name in [*self.workers, "head"]:
            self.kill_node(name)
        self.start()

    # --- questions ---------------------------------------------------------------------------------

    def jobs_api_answers(self) -> bool:
        import requests

        try:
            return requests.get(f"{self.dashboard}/api/version", timeout=5).status_code == 200
        except requests.exceptions.RequestException:
            return False

    def live_nodes(self) -> set[str]:
        return set(self.node_ids())

    def node_ids(self) -> dict[str, str]:
        """Each live node's name → its Ray node id (from Ray's state API; the name from its resource)."""
        from ray.util.state import list_nodes

        try:
            nodes = list_nodes(address=self.dashboard, timeout=10, raise_on_missing_output=False)
        except Exception:  # the state API's errors are many (connection, timeout, a head restarting)
            return {}
        names = {}
        for node in nodes:
            if node.state != "ALIVE":
                continue
            for resource in node.resources_total or {}:
                if resource.startswith("evald_node_"):
                    names[resource.removeprefix("evald_node_")] = node.node_id
                elif resource == "evald_head":
                    names["head"] = node.node_id
        return names

    def _wait(self, ready: Callable[[], bool], what: str, node: str) -> None:
        def died() -> bool:
            pid = self.pids.get(node)
            return pid is not None and not alive(pid)

        if not wait_until(ready, START_TIMEOUT_S, interval=0.3, hopeless=died):
            said = tail(self._log(node))
            raise RayUnavailable(f"timed out waiting for {what}; its `ray start` output ends: {said}")


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def _root() -> Path:
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def ensure_cluster(root: Path | None = None) -> RayCluster:
    """The session's cluster: the running one recorded under ``root``, else a new one started."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise RayUnavailable(f"ray is not installed ({exc}): pip install -e '.[dev]'") from exc
    folder = root or _root()
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".start.lock"), timeout=patient(START_TIMEOUT_S * 3)):
        cluster = RayCluster(folder)
        if cluster.load() and cluster.jobs_api_answers() and cluster.live_nodes() >= {"head", *WORKERS}:
            return cluster
        if cluster.pids:
            cluster.stop()
        cluster = RayCluster(folder)
        cluster.start()
        return cluster


@contextlib.contextmanager
def private_cluster(
    root: Path, *, workers: tuple[str, ...] = WORKERS, gpus: dict[str, int] | None = None
) -> Iterator[RayCluster]:
    """A cluster of one test module's own under ``root`` (short: Ray's socket paths under it must stay
    under 108 bytes), started and, at the end, stopped; the test is skipped where Ray cannot start
    (failed under ``EVALD_REQUIRE_RAY=1``)."""
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"no Ray: {exc}") if required() else pytest.skip(f"no Ray: {exc}")
    cluster = RayCluster(root, workers=workers, gpus=dict(gpus or {}))
    try:
        try:
            cluster.start()
        except RayUnavailable as exc:
            pytest.fail(str(exc)) if required() else pytest.skip(str(exc))
        yield cluster
    finally:
        cluster.stop()


def _users(folder: Path) -> Path:
    users = folder / "users"
    users.mkdir(parents=True, exist_ok=True)
    return users


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """The local Ray cluster (see the module's docstring), held by each module that uses it and stopped
    when the last holder's module ends: idle, its nine processes took ~8 % of a core, for the whole run
    after its two files (the first ones started) were done. A module that needs it later starts it again.

    A test that kills or stops a node must start it again (``start_worker``, ``restart``); this fixture
    checks at the end of the module only.
    """
    folder = _root()
    # Held before the cluster is looked for: a holder leaving meanwhile sees this one and leaves it up.
    me = _users(folder) / str(os.getpid())
    me.touch()
    try:
        cluster = ensure_cluster(folder)
    except (RayUnavailable, OSError) as exc:
        me.unlink(missing_ok=True)
        message = f"no Ray cluster: {exc}"
        if required():
            pytest.fail(message)
        pytest.skip(message)
    yield cluster
    me.unlink(missing_ok=True)
    with FileLock(str(folder / ".start.lock"), timeout=patient(START_TIMEOUT_S * 3)):
        others = [p for p in _users(folder).iterdir() if p.name.isdigit() and alive(int(p.name))]
        if not others:
            running = RayCluster(folder)
            if running.load():
                running.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "start"
    try:
        if command == "start":
            cluster = ensure_cluster()
            print(f"Ray cluster up: address {cluster.address}, dashboard {cluster.dashboard}")
        elif command == "stop":
            cluster = RayCluster(_root())
            if cluster.load():
                cluster.stop()
        elif command == "status":
            cluster = RayCluster(_root())
            print(
                "up" if cluster.load() and cluster.jobs_api_answers() else "down",
                sorted(cluster.live_nodes()),
            )
        else:
            print("usage: python -m tests.raycluster [start|stop|status]", file=sys.stderr)
            return 2
    except RayUnavailable as exc:
        print(f"raycluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
