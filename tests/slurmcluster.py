"""A one-host Slurm cluster of the tests' own: munged, slurmctld and slurmd from Debian's ``slurm-wlm``.

Everything lives under one folder (``EVALD_SLURM_ROOT``, default ``/tmp/evald-slurm``): slurm.conf, the
munge key and socket, the controller's StateSaveLocation, slurmd's spool, logs and pid files. Nothing in
/etc is read or written, so the cluster never meets a system one: its clients find it through
``SLURM_CONF`` (:attr:`SlurmCluster.env`), and munge through ``AuthInfo=socket=`` in its slurm.conf.

The daemons outlive the test session on purpose (starting them costs seconds, and a second session on
this machine reuses them): :func:`ensure_cluster` starts whatever of the three is not answering and waits
until ``sinfo`` reports the node idle. Run as a script to start or stop it by hand::

    python -m tests.slurmcluster start     # or: stop, status, env

slurmd must run as root (it starts jobs as their users); elsewhere :class:`ClusterUnavailable` says so.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from tests.deadlines import patient
from tests.processes import spawn, tail, wait_until

#: Set to 1 (CI does) to turn "no Slurm cluster here" from a skip into a failure.
REQUIRE_ENV = "EVALD_REQUIRE_SLURM"
ROOT_ENV = "EVALD_SLURM_ROOT"
DEFAULT_ROOT = Path("/tmp/evald-slurm")
CLUSTER_NAME = "evald-test"
PARTITION = "debug"
#: Not Slurm's default ports (6817/6818), so that a system cluster on this machine is never reached.
CONTROLLER_PORT = 16817
SLURMD_PORT = 16818
START_TIMEOUT_SECS = 60.0

INSTALL_HINT = (
    "install Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge) and run as root, or start "
    "the cluster with `python -m tests.slurmcluster start`"
)


class ClusterUnavailable(RuntimeError):
    """No Slurm binaries here, not root, or a daemon would not start (the message says which)."""


def _binary(name: str) -> str:
    for folder in ("/usr/sbin", "/usr/bin"):
        path = Path(folder) / name
        if path.is_file():
            return str(path)
    found = shutil.which(name)
    if found is None:
        raise ClusterUnavailable(f"{name} not found: {INSTALL_HINT}")
    return found


def _memory_mb() -> int:
    with Path("/proc/meminfo").open(encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise ClusterUnavailable("cannot read MemTotal from /proc/meminfo")


@dataclass(frozen=True)
class SlurmCluster:
    root: Path
    node: str
    cpus: int
    #: What slurm.conf gives the node: most of this machine's memory, leaving the rest to the system.
    memory_mb: int

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm client (sbatch, squeue, …) needs in its environment to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def _pidfile(self, daemon: str) -> Path:
        return self.root / "run" / f"{daemon}.pid"

    def _log(self, daemon: str) -> Path:
        return self.root / "log" / f"{daemon}.log"

    # --- configuration -------------------------------------------------------------------------------

    def write_config(self) -> None:
        prepare_root(self.root)
        write_conf(
            self.conf,
            conf_text(
                header="Written by tests/slurmcluster.py: a one-host cluster for evald's tests.",
                cluster_name=CLUSTER_NAME,
                root=self.root,
                munge_socket=self.munge_socket,
                controller_port=CONTROLLER_PORT,
                slurmd_port=SLURMD_PORT,
                slurmd_files="slurmd",
                nodes=(
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} "
                    "State=UNKNOWN\n"
                    f"PartitionName={PARTITION} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP "
                    "OverSubscribe=NO"
                ),
            ),
        )

    # --- daemons -------------------------------------------------------------------------------------

    def _pid(self, daemon: str) -> int | None:
        """The pid in ``daemon``'s pid file, if that process is alive and is ``daemon``."""
        try:
            pid = int(self._pidfile(daemon).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ValueError, ProcessLookupError):
            return None
        name = Path(cmdline.split(b"\0", 1)[0].decode(errors="replace")).name
        return pid if name == daemon else None

    def _spawn(self, daemon: str, args: Sequence[str]) -> None:
        """Start ``daemon`` in its own session (it outlives this process); its output goes to its log."""
        spawn([_binary(daemon), *args], self._log(f"{daemon}.out"), self.client_env())

    def _start_munged(self) -> None:
        if self._pid("munged") is not None:
            return
        self._spawn(
            "munged",
            [
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={self.root / 'munge' / 'munge.key'}",
                f"--pid-file={self._pidfile('munged')}",
                f"--log-file={self._log('munged')}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            ],
        )
        _wait_for(lambda: self.munge_socket.exists(), "munged's socket", self._log("munged"))

    def start_controller(self) -> None:
        if self._pid("slurmctld") is None:
            # Without -c: a restarted controller recovers its jobs from StateSaveLocation.
            self._spawn("slurmctld", ["-D", "-f", str(self.conf)])
        _wait_for(self.controller_answers, "slurmctld answering", self._log("slurmctld"))

    def stop_controller(self) -> None:
        """Stop slurmctld (SIGTERM, as ``systemctl stop`` does); running jobs go on under slurmd."""
        pid = self._pid("slurmctld")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _wait_for(lambda: self._pid("slurmctld") is None, "slurmctld to stop", self._log("slurmctld"))

    def restart_controller(self, down_secs: float = 0.0) -> None:
        self.stop_controller()
        if down_secs > 0:
            time.sleep(down_secs)
        self.start_controller()

    def _start_slurmd(self) -> None:
        if self._pid("slurmd") is None:
            self._spawn("slurmd", ["-D", "-f", str(self.conf), "-N", self.node])

    def controller_answers(self) -> bool:
        done = self._client("scontrol", "ping")
        return done.returncode == 0 and "UP" in done.stdout

    def node_state(self) -> str:
        done = self._client("sinfo", "-h", "-N", "-n", self.node, "-o", "%T")
        return done.stdout.strip() if done.returncode == 0 else ""

    def _client(self, *command: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [_binary(command[0]), *command[1:]],
                capture_output=True,
                text=True,
                timeout=patient(20),
                env=self.client_env(),
            )
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(list(command), 1, "", "timed out")

    def start(self) -> None:
        """Start what is not running (munged, slurmctld, slurmd) and wait until the node takes jobs."""
        if os.geteuid() != 0:
            raise ClusterUnavailable(f"slurmd must run as root (this is uid {os.geteuid()}): {INSTALL_HINT}")
        self.write_config()
        self._start_munged()
        self.start_controller()
        self._start_slurmd()

        def idle() -> bool:
            state = self.node_state().rstrip("*~#")
            if state in {"down", "drained", "draining", "fail"}:
                # A node left down by an earlier run (its slurmd was killed) comes back on request.
                self._client("scontrol", "update", f"NodeName={self.node}", "State=RESUME")
            return state in {"idle", "mixed", "allocated"}

        _wait_for(idle, f"node {self.node} idle", self._log("slurmd"))

    def stop(self) -> None:
        """Stop all three daemons (jobs still running are killed with slurmd)."""
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid = self._pid(daemon)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

            def gone(name: str = daemon) -> bool:
                return self._pid(name) is None

            _wait_for(gone, f"{daemon} to stop", self._log(daemon))

    def partitions(self) -> list[str]:
        done = self._client("sinfo", "-h", "-o", "%R")
        return done.stdout.split()


def prepare_root(root: Path) -> None:
    """A cluster's folders under ``root``, and its munge key."""
    for sub in ("munge", "state", "spool", "log", "run"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # munged refuses a socket folder others may write to, and a key others may read.
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)


def conf_text(
    *,
    header: str,
    cluster_name: str,
    root: Path,
    munge_socket: Path,
    controller_port: int,
    slurmd_port: int,
    slurmd_files: str,
    nodes: str,
    extra: str = "",
) -> str:
    """The slurm.conf of a test cluster under ``root`` (the tests' one-host cluster, and the policy
    tests' two-node one): ``slurmd_files`` names slurmd's pid and log files (``slurmd-%n`` for several
    slurmd on one host); ``extra`` lines before the nodes; ``nodes``: the node and partition lines."""
    return f"""\
# {header}
ClusterName={cluster_name}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool" / "slurmd-%n"}
SlurmctldPidFile={root / "run" / "slurmctld.pid"}
SlurmdPidFile={root / "run" / f"{slurmd_files}.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / f"{slurmd_files}.log"}
SlurmctldDebug=info
SlurmdDebug=info
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# Short timeouts: a test waits seconds, not minutes, for a state to change.
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=2
MinJobAge=600
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
{extra}# The declared CPUs and memory are this machine's; the override keeps the node up if the kernel
# reports a topology slurmd reads differently.
SlurmdParameters=config_overrides
{nodes}
"""


def write_conf(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` unless it holds it already (a running cluster's file is left as is)."""
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def _wait_for(ready: Callable[[], bool], what: str, log: Path, timeout: float = START_TIMEOUT_SECS) -> None:
    if not wait_until(ready, timeout, interval=0.2):
        said = tail(log)
        raise ClusterUnavailable(f"timed out after {timeout:g} s waiting for {what}; {log} ends: {said}")


def cluster_here(root: Path | None = None) -> SlurmCluster:
    """This machine's test cluster (not started)."""
    folder = root or Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    cpus = os.cpu_count() or 1
    memory = max(256, int(_memory_mb() * 0.8))
    return SlurmCluster(root=folder, node=socket.gethostname().split(".")[0], cpus=cpus, memory_mb=memory)


def ensure_cluster(root: Path | None = None) -> SlurmCluster:
    """The test cluster, started where it is not already up (idempotent)."""
    for name in ("munged", "slurmctld", "slurmd", "sbatch", "squeue"):
        _binary(name)
    if os.geteuid() != 0:
        raise ClusterUnavailable(f"slurmd must run as root (this is uid {os.geteuid()}): {INSTALL_HINT}")
    cluster = cluster_here(root)
    cluster.root.mkdir(parents=True, exist_ok=True)
    # Two test processes (xdist) may both find the cluster down: one starts it, the other waits.
    with FileLock(str(cluster.root / ".start.lock"), timeout=patient(START_TIMEOUT_SECS * 2)):
        cluster.start()
    return cluster


def required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The one-host Slurm cluster, started if needed and left running (see the module's docstring).

    Skipped with a message where none can be started, unless ``EVALD_REQUIRE_SLURM=1``: then it fails.
    A test that stops slurmctld must start it again (``restart_controller``); this fixture checks.
    """
    try:
        cluster = ensure_cluster()
    except (ClusterUnavailable, OSError) as exc:
        message = f"no Slurm cluster: {exc}"
        if required():
            pytest.fail(message)
        pytest.skip(message)
    yield cluster
    if not cluster.controller_answers():
        cluster.start_controller()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else "start"
    try:
        if command == "start":
            cluster = ensure_cluster()
            print(f"Slurm cluster {CLUSTER_NAME} up: export SLURM_CONF={cluster.conf}")
        elif command == "stop":
            cluster_here().stop()
        elif command == "status":
            cluster = cluster_here()
            print("up" if cluster.controller_answers() else "down", cluster.node_state())
        elif command == "env":
            print(f"export SLURM_CONF={cluster_here().conf}")
        else:
            print("usage: python -m tests.slurmcluster [start|stop|status|env]", file=sys.stderr)
            return 2
    except ClusterUnavailable as exc:
        print(f"slurmcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
