"""The tests' deadlines stretch with the machine's load (tests/deadlines.py), so a loaded machine cannot
make a wait time out that a quiet one finishes: checked here beside a real CPU hog."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given
from hypothesis import strategies as st

from tests.deadlines import MAX_STRETCH, Deadline, cores, runnable, share, wait_process


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=512))
def test_a_second_counts_whole_when_quiet_and_less_under_load_never_below_the_cap(
    running: int, available: int
) -> None:
    counted = share(running, available)
    assert 1 / MAX_STRETCH <= counted <= 1
    assert (counted == 1) == (running <= available)
    # More runnable processes never make a second count more.
    assert share(running + 1, available) <= counted


def test_an_unreadable_load_counts_every_second() -> None:
    assert share(None, 2) == 1.0


@contextmanager
def _hog(processes: int) -> Iterator[None]:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        # Until the kernel counts them as runnable: the hog is measured, not assumed.
        deadline = time.monotonic() + 30
        while (runnable() or 0) < processes and time.monotonic() < deadline:
            time.sleep(0.05)
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def test_a_deadline_lasts_longer_beside_a_cpu_hog() -> None:
    """Four spinning processes per core: a deadline must last well past its wall seconds (each second
    counts at most a fifth, 1 / (4 + 1) of the runnable processes' share, while the hog runs). A short
    deadline: the hog takes every core from the rest of the suite while it runs."""
    with _hog(4 * cores()):
        deadline = Deadline(0.4)
        while not deadline.expired():
            time.sleep(0.02)
        waited = deadline.waited()
    assert waited >= 0.8, f"a 0.4 s deadline ended after {waited:.2f} s beside a 4-per-core hog"
    assert waited <= 0.4 * MAX_STRETCH + 1.0


def test_a_quiet_deadline_ends_near_its_seconds() -> None:
    deadline = Deadline(0.3)
    while not deadline.expired():
        time.sleep(0.02)
    assert deadline.waited() >= 0.3


def test_waiting_on_a_process_gives_its_status_or_times_out() -> None:
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_process(done, 60) == 3
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.monotonic()
        try:
            wait_process(sleeper, 0.5)
        except subprocess.TimeoutExpired:
            pass
        else:
            raise AssertionError("a 60 s sleeper finished within a 0.5 s wait")
        assert time.monotonic() - started >= 0.5
    finally:
        sleeper.kill()
        sleeper.wait()
