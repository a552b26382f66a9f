"""Starting, watching and stopping the daemons of the tests' own clusters (tests/raycluster.py,
tests/slurmcluster.py): what both do with processes, in one place.

A cluster's daemon is started in a session (and so a process group) of its own, its output appended to a
log file, so that it outlives a test process that dies and can be stopped, whole, by its group. Waits
poll a condition until a deadline, and an error quotes the end of the daemon's log (its reason, mostly).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.deadlines import Deadline

#: Characters of a daemon's log quoted in an error about it.
TAIL_CHARS = 1500


def free_port() -> int:
    """A TCP port free on loopback now (another process may take it before its user binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not; another user's process does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it (a process that started a session of its own is not in the
    group of ``pid``, but still in its tree)."""
    import psutil

    try:
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def kill_tree(pid: int, signum: int, known: Sequence[int] = ()) -> None:
    """Signal the group of ``pid`` and each process of its tree (``known``: the tree as it was before)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
    for each in dict.fromkeys([*known, *tree(pid)]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signum)


def spawn(command: Sequence[str], log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session of its own (it outlives this process), its output appended to
    ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            env=dict(env),
        )


def wait_until(
    ready: Callable[[], bool],
    timeout: float,
    *,
    interval: float,
    hopeless: Callable[[], bool] | None = None,
) -> bool:
    """Whether ``ready()`` came true within ``timeout`` seconds, asked every ``interval``; False at once
    when ``hopeless()`` (the daemon that would make it true died)."""
    # ``timeout`` is in seconds of a quiet machine: a loaded one stretches it (tests/deadlines.py).
    deadline = Deadline(timeout)
    while not deadline.expired():
        if ready():
            return True
        if hopeless is not None and hopeless():
            return False
        time.sleep(interval)
    return False


def tail(log: Path, chars: int = TAIL_CHARS) -> str:
    """The end of ``log`` (empty where it cannot be read), for an error about its daemon."""
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-chars:]
    return ""
