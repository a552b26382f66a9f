"""Disk full: the SQLite database's filesystem, then (separately) the daemon's scratch folder.

Each lives on a tmpfs of its own (``mount -t tmpfs -o size=...``, so this scenario needs root; it is
unmounted afterwards). A first checkpoint is evaluated; then a filler file takes every free byte, a
second checkpoint is written and the daemon runs on the full disk for ``hold`` seconds; then the filler
is removed and both checkpoints must end evaluated, once. The daemon may exit on the full disk if the
supervisor restarts it (``crashes`` is reported, not failed: the issue asks for "alive, or restarted by
its supervisor"); each fault must leave a log line naming it (a message quoting ENOSPC or SQLite's
"database or disk is full").
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from reliability import checkpoints
from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.workspace import TASK, RunSpec, wait_for, workspace, write_dataset

WORDS = ("No space left on device", "database or disk is full", "disk is full", "ENOSPC", "Errno 28")


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    folder.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise PermissionError(f"cannot mount a tmpfs at {folder} (needs root): {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """A file taking every free byte of ``folder``'s filesystem."""
    filler = folder / "filler"
    chunk = b"\0" * 4096
    with filler.open("wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    os.sync()
    return filler


def run_database(options: Options) -> Figures:
    return _run(options, on="database")


def run_scratch(options: Options) -> Figures:
    return _run(options, on="scratch")


def _run(options: Options, *, on: str) -> Figures:
    figures = Figures(f"disk full: {'SQLite database' if on == 'database' else 'scratch folder'}")
    figures.crashes_allowed = True
    hold = options.pick(short=10.0, full=30.0)
    with workspace(f"disk-{on}", options.workdir) as ws, tmpfs(ws.folder / "small", "4m") as small:
        try:
            root = ws.folder / "runs" / "toy"
            root.mkdir(parents=True)
            if on == "database":
                ws.url = f"sqlite:///{small / 'evald.db'}"
            ws.write_config(
                [RunSpec("toy", root)],
                dataset=write_dataset(ws.folder / "arith.jsonl", 4),
                state_dir=small / "state" if on == "scratch" else None,
            )
            ws.upgrade()
            checkpoints.toy_checkpoint()
            ws.start_daemon()
            checkpoints.write(root, 1)
            wait_for(lambda: ws.jobs_settled(1), 300, "the first checkpoint")
            ws.fault(f"{on} disk full", words=WORDS)
            filler = fill(small)
            checkpoints.write(root, 2)
            time.sleep(hold)
            filler.unlink()
            wait_for(lambda: ws.jobs_settled(2), 300, "the checkpoint written while the disk was full")
        except TimeoutError as exc:
            figures.notes.append(str(exc))
        if on == "scratch":
            # Count the job folders where they were, before the tmpfs goes.
            ws.folder.joinpath("state").symlink_to(small / "state")
        figures.written = 2
        expected = Expected(due=frozenset({"toy/step_1", "toy/step_2"}), tasks=(TASK,))
        result = ws.finish(figures, expected)
        if on == "scratch":
            ws.folder.joinpath("state").unlink()
        return result
