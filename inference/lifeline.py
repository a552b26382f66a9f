"""A worker process dies with the process that started it, even when that one is SIGKILLed.

The daemon starts a worker (or the launcher of a worker group) with its pid in ``EVALD_PARENT_PID``; the
launcher execs ``torchrun`` with its own pid there, so each rank is tied to torchrun, and torchrun to the
daemon. DeepSpeed's launcher puts a per-node launcher of its own between, which nothing ties; its ranks
on the daemon's node watch the daemon instead (``EVALD_DAEMON_PID``). A worker nobody will read must not
go on holding GPUs: its job is redone when the daemon restarts.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from inference.spec import PARENT_PID_ENV

_PR_SET_PDEATHSIG = 1

#: The daemon's pid, for ranks whose parent is not tied to it.
DAEMON_PID_ENV = "EVALD_DAEMON_PID"
#: How often such a rank looks for the daemon.
WATCH_SECS = 1.0


def die_with_parent() -> None:
    """Arm ``PR_SET_PDEATHSIG`` against ``EVALD_PARENT_PID`` (Linux; a no-op elsewhere or when unset)."""
    expected = os.environ.get(PARENT_PID_ENV, "")
    if expected.isdigit():
        die_with(int(expected))


def die_with(parent: int) -> None:
    """Be killed when ``parent``, this process's parent, exits (Linux; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        # The parent died before the signal was armed.
        os._exit(1)


def watch_daemon() -> None:
    """Exit once the daemon in ``EVALD_DAEMON_PID`` is gone (a no-op when unset), checked every second.

    The daemon is known by its pid and start time, so a reused pid does not keep the rank alive.
    """
    import psutil

    pid = os.environ.get(DAEMON_PID_ENV, "")
    if not pid.isdigit():
        return
    try:
        born = psutil.Process(int(pid)).create_time()
    except psutil.NoSuchProcess:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCH_SECS)
            try:
                alive = psutil.Process(int(pid)).create_time() == born
            except psutil.NoSuchProcess:
                alive = False
            if not alive:
                os._exit(1)

    threading.Thread(target=watch, name="evald-lifeline", daemon=True).start()
