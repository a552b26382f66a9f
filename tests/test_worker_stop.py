"""Stopping a worker stops every process under it (daemon/running/workers.py), including a launcher's
ranks, which torchrun starts in sessions of their own (out of reach of the worker's process group) and
which may start while the stop is under way: a job killed for its timeout while its group starts left two
ranks running beside the next attempt."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from daemon.running.workers import WorkerProcess
from tests.deadlines import Deadline

#: A launcher like torchrun: it ignores SIGTERM, starts a "rank" in the same session at once and, once
#: told that the stop began, another in a session of its own; each rank writes its pid and sleeps.
LAUNCHER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from pathlib import Path
    folder = Path(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: (folder / "term").touch())
    rank = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    subprocess.Popen([sys.executable, "-c", rank, str(folder / "rank0")])
    while not (folder / "term").exists():
        time.sleep(0.02)
    subprocess.Popen([sys.executable, "-c", rank, str(folder / "rank1")], start_new_session=True)
    time.sleep(600)
    """
)


def _wait_for(path: Path) -> int:
    deadline = Deadline(30)
    while not path.exists() or not path.read_text():
        assert not deadline.expired(), f"{path.name} never started"
        time.sleep(0.02)
    return int(path.read_text())


class _Launcher(subprocess.Popen[bytes]):
    """The launcher's process, whose stop grace (``wait`` with a timeout, while it ignores SIGTERM) lasts
    until its second rank has started: the moment the stop began, rank 0 was all there was."""

    folder: Path

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None and self.poll() is None:
            _wait_for(self.folder / "rank1")
            raise subprocess.TimeoutExpired(self.args, timeout)
        return super().wait(timeout)


def test_a_rank_started_in_a_session_of_its_own_during_the_stop_is_killed_too(tmp_path: Path) -> None:
    with (tmp_path / "worker.log").open("wb") as log:
        launcher = _Launcher(
            [sys.executable, "-c", LAUNCHER, str(tmp_path)], stdout=log, stderr=log, start_new_session=True
        )
    launcher.folder = tmp_path
    worker = WorkerProcess(launcher, tmp_path / "worker.log")
    ranks = [_wait_for(tmp_path / "rank0")]
    try:
        worker.kill(grace_secs=60)
        ranks.append(int((tmp_path / "rank1").read_text()))
        assert worker.poll() is not None
        for rank, pid in enumerate(ranks):
            assert not _running(pid), f"rank {rank} ({pid}) outlived the stop"
    finally:
        for pid in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a dead rank whose parent was killed may stay a zombie until init reaps it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
