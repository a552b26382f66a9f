"""Deadlines that a loaded machine cannot miss: a test's wait is given in seconds of a quiet machine.

A test that waits for a daemon, a worker or a cluster gives up after a deadline, and a fixed one is missed
when the machine runs other work: at load 8 on 2 cores every process gets a quarter of a core, so a wait
that takes 30 s quiet takes two minutes. Here a wait spends its budget only at the rate the machine gives
its processes: each interval counts ``cores / runnable`` of its wall time (``runnable``: the processes
ready to run, from ``/proc/stat``, at least the core count). Quiet, a wait ends at its wall deadline; at
load 8 on 2 cores, four times later. The stretch is capped (:data:`MAX_STRETCH`), so a test that is
really stuck still fails, and pytest-timeout's own limit (pyproject.toml) is the last guard.

The budget is measured in the machine's fair share, not in the test's own CPU time: the processes a
test waits on (a daemon, its workers) are other processes.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

#: How far a wait may stretch past its quiet-machine deadline, whatever the load.
MAX_STRETCH = 12.0
_STAT = Path("/proc/stat")


def cores() -> int:
    """The cores this process may run on (its affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def runnable() -> int | None:
    """Processes ready to run now (``procs_running`` of ``/proc/stat``); None where it cannot be read."""
    try:
        for line in _STAT.read_text().splitlines():
            if line.startswith("procs_running "):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def share(running: int | None, available: int) -> float:
    """The part of a second that counts against a deadline when ``running`` processes share
    ``available`` cores (pure): 1 on a quiet machine, ``available / running`` on a loaded one, never
    under ``1 / MAX_STRETCH``."""
    if running is None or running <= available:
        return 1.0
    return max(available / running, 1.0 / MAX_STRETCH)


class Deadline:
    """``seconds`` of a quiet machine, spent at the machine's fair-share rate (see the module)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._cores = cores()
        self._spent = 0.0
        self._last = time.monotonic()
        self.started = self._last

    def _tick(self) -> None:
        now = time.monotonic()
        self._spent += (now - self._last) * share(runnable(), self._cores)
        self._last = now

    def expired(self) -> bool:
        self._tick()
        return self._spent >= self.seconds

    def left(self) -> float:
        """Quiet-machine seconds left (never negative)."""
        self._tick()
        return max(0.0, self.seconds - self._spent)

    def waited(self) -> float:
        """Wall seconds since the deadline was set."""
        return time.monotonic() - self.started


def patient(seconds: float) -> float:
    """A fixed timeout for a call that cannot poll (``subprocess.run``): ``seconds`` stretched by the load
    now, a one-off reading, so the bound is generous rather than exact."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return seconds
    return seconds / share(max(round(load), runnable() or 0), cores())


def wait_process(process: subprocess.Popen[bytes] | subprocess.Popen[str], seconds: float) -> int:
    """``process``'s exit status, waiting up to ``seconds`` of a quiet machine (:class:`Deadline`);
    ``subprocess.TimeoutExpired`` past it, as ``Popen.wait`` would raise."""
    deadline = Deadline(seconds)
    while True:
        try:
            return process.wait(timeout=min(1.0, max(deadline.left(), 0.05)))
        except subprocess.TimeoutExpired:
            if deadline.expired():
                raise subprocess.TimeoutExpired(process.args, deadline.waited()) from None
