"""Ended jobs' folders under a detached executor's ``job_dir`` (Slurm's, Ray's) removed once their
retention is over.

A job's folder (``<job id>-<attempt>``, ``-batch<N>`` for a Slurm out-of-memory rerun) is kept
``keep_job_dirs_secs`` after its job succeeded (``exit.json`` says 0 and ``result.json`` holds no error)
and ``keep_failed_job_dirs_secs`` otherwise (its logs are what one debugs), counted from its last write
(and at least :data:`UNENDED_GRACE_SECS` for one without ``exit.json``); never while its job is running
anywhere (the database says) or held by this daemon. A job folder probe's ``.probe-*`` folder that did not
answer is kept as a failed job's is (the tokens it placed in other folders, see :mod:`.folder_probe`, are
removed with it).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections.abc import Collection
from pathlib import Path

import structlog

from daemon.config import ExecutorConfig
from daemon.running.executors import folder_probe
from inference.spec import JobResult

#: A folder without ``exit.json`` (cancelled while queued, killed, or just made) is this old at least
#: before it is removed, whatever the retention.
UNENDED_GRACE_SECS = 600.0

#: What both executors write in a job's folder: the end, the logs, the result, a probe's answer.
EXIT_NAME = "exit.json"
_WRITTEN = (EXIT_NAME, "worker.log", "driver.log", "result.json", "seen")

_JOB_FOLDER = re.compile(r"^(\d+)-(\d+)(?:-batch\d+)?$")

log = structlog.get_logger("evald.executor")


def tidy(
    job_dir: Path, config: ExecutorConfig, *, busy: Collection[int], keep: Collection[Path], event: str
) -> list[Path]:
    """:func:`sweep` with ``config``'s retentions, the folders removed said as ``event`` (the
    executor's own: ``slurm.job_dirs_removed``, ``ray.job_dirs_removed``)."""
    removed = sweep(
        job_dir,
        busy=busy,
        keep=keep,
        keep_ok_secs=config.keep_job_dirs_secs,
        keep_failed_secs=config.keep_failed_job_dirs_secs,
    )
    if removed:
        log.info(event, job_dir=str(job_dir), folders=len(removed))
    return removed


def sweep(
    job_dir: Path,
    *,
    busy: Collection[int],
    keep: Collection[Path] = (),
    keep_ok_secs: float,
    keep_failed_secs: float,
    now: float | None = None,
) -> list[Path]:
    """Remove the folders under ``job_dir`` whose retention is over (see the module's docstring);
    ``busy``: job ids running anywhere or held by this daemon; ``keep``: folders never to remove (this
    daemon's probe). Returns what was removed."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(job_dir.iterdir())
    except OSError:
        return []
    kept = {Path(p).resolve() for p in keep}
    for entry in entries:
        match = _JOB_FOLDER.match(entry.name)
        probe = entry.name.startswith(".probe-")
        if not (match or probe) or not entry.is_dir() or entry.resolve() in kept:
            continue
        if match and int(match.group(1)) in busy:
            continue
        try:
            age = now - _last_write(entry)
        except OSError:
            continue
        retention = keep_ok_secs if match and _succeeded(entry) else keep_failed_secs
        if not (entry / EXIT_NAME).exists():
            # No end written: a folder just made for a submission under way is not an ended job's.
            retention = max(retention, UNENDED_GRACE_SECS)
        if age >= retention:
            if probe:
                folder_probe.remove(entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _succeeded(folder: Path) -> bool:
    return exit_code(folder) == 0 and result(folder) is not None


def exit_code(folder: Path) -> int | None:
    """The worker's exit status as its job wrote it in ``exit.json`` (the Slurm batch script, the Ray
    driver), if it did."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((folder / EXIT_NAME).read_text(encoding="utf-8"))["exit_code"])
    return None


def result(folder: Path) -> JobResult | None:
    """The worker's result, where it wrote one without an error."""
    with contextlib.suppress(OSError, ValueError):
        found = JobResult.read(folder / "result.json")
        return found if found.error is None else None
    return None


def _last_write(folder: Path) -> float:
    times = [folder.stat().st_mtime]
    for name in _WRITTEN:
        with contextlib.suppress(OSError):
            times.append((folder / name).stat().st_mtime)
    return max(times)
