"""A worker process dies with the process that started it, even when that one is SIGKILLed.

The daemon starts a worker (or the launcher of a worker group) with its pid in ``EVALD_PARENT_PID``; the
launcher execs ``torchrun`` with its own pid there, so each rank is tied to torchrun, and torchrun to the
daemon. A worker nobody will read must not go on holding GPUs: its job is redone when the daemon restarts.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from inference.spec import PARENT_PID_ENV

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Arm ``PR_SET_PDEATHSIG`` against ``EVALD_PARENT_PID`` (Linux; a no-op elsewhere or when unset)."""
    expected = os.environ.get(PARENT_PID_ENV, "")
    if not expected.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(expected):
        # The parent died before the signal was armed.
        os._exit(1)
