"""What the Slurm executor leaves under ``job_dir``, looked after: the job folder probe (submitted, read,
and a dead daemon's cancelled); the folders of ended jobs are removed by :mod:`.job_dirs`.

A probe job carries ``<prefix>:probe:uid=<uid>:owner=<host>:<pid>`` as its comment. One still queued whose
daemon is dead (on this host: its pid is gone; elsewhere: queued for :data:`STALE_PROBE_SECS`) would stay
queued forever where its options keep it pending (``--hold``, a reservation): each clean-up, and each new
probe, cancels such probes of this prefix and this user.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

import structlog

from daemon.config import ExecutorConfig
from daemon.running.executors import folder_probe, slurm_script
from daemon.running.executors.base import (
    Active,
    EndKind,
    ExecutorError,
    ExecutorUnavailable,
    Handle,
    SharedFolder,
    Status,
)
from daemon.running.executors.slurm_cli import SlurmCli
from daemon.running.executors.slurm_output import SlurmError, SlurmJob, SubmitRejected

log = structlog.get_logger("evald.executor.slurm")

#: A probe of another host's daemon queued this long is taken for a dead daemon's.
STALE_PROBE_SECS = 6 * 3600.0


class SlurmExecutor(Protocol):
    """What of the Slurm executor (:mod:`.slurm`, which calls this module) the probe uses."""

    kind: str
    cli: SlurmCli

    @property
    def config(self) -> ExecutorConfig: ...

    @property
    def job_dir(self) -> Path: ...

    def poll(self, handle: Handle) -> Status: ...

    def refused(self, exc: SubmitRejected, script: str, plain: str | None = None) -> ExecutorError: ...


def probe_comment(prefix: str) -> str:
    return f"{prefix}:probe:uid={os.getuid()}:owner={socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_probes(queue: Iterable[SlurmJob], prefix: str, now: float) -> list[SlurmJob]:
    """This user's probes of ``prefix`` still queued or running whose daemon is gone (see the module's
    docstring); this daemon's own are never among them."""
    out = []
    me = f"{socket.gethostname()}:{os.getpid()}"
    for job in queue:
        if job.name != f"{prefix}-probe" or job.finished:
            continue
        head, _, rest = job.comment.partition(":probe:")
        fields = dict(part.split("=", 1) for part in rest.split(":") if "=" in part)
        if head != prefix or fields.get("uid") != str(os.getuid()):
            continue
        owner = rest.partition("owner=")[2]
        host, _, pid = owner.rpartition(":")
        if owner == me:
            continue
        dead = host == socket.gethostname() and pid.isdigit() and not _alive(int(pid))
        old = job.submit_time is not None and now - job.submit_time > STALE_PROBE_SECS
        if dead or old:
            out.append(job)
    return out


def cancel_stale_probes(executor: SlurmExecutor) -> list[str]:
    """Cancel the probes :func:`stale_probes` finds; their Slurm ids. A controller that does not answer
    leaves them for the next time."""
    try:
        queue = executor.cli.queue()
    except SlurmError:
        return []
    cancelled = []
    for job in stale_probes(queue, executor.config.name_prefix, time.time()):
        with contextlib.suppress(SlurmError):
            executor.cli.cancel(job.job_id)
            cancelled.append(job.job_id)
            log.info("slurm.stale_probe_cancelled", slurm_job_id=job.job_id, comment=job.comment)
    return cancelled


def submit_probe(executor: SlurmExecutor, also: Sequence[SharedFolder] = ()) -> Handle:
    """Submit a job that reads back a token written here into ``job_dir`` and into each folder of
    ``also`` (see :mod:`.folder_probe`; a dead daemon's probes cancelled first)."""
    cancel_stale_probes(executor)
    folder, files = folder_probe.make(executor.job_dir, also)
    comment = probe_comment(executor.config.name_prefix)
    script = slurm_script.probe_script(executor.config, folder, comment, files)
    (folder / "probe.sbatch").write_text(script, encoding="utf-8")
    try:
        slurm_id = executor.cli.submit(folder / "probe.sbatch")
    except SubmitRejected as exc:
        _drop(folder)
        raise executor.refused(exc, script) from exc
    except SlurmError as exc:
        folder_probe.remove(folder)  # no answer will be read: its tokens go (the folder as a failed job's)
        raise ExecutorUnavailable(f"cannot submit the job folder probe: {exc.message}") from exc
    return Handle(executor.kind, 0, 0, folder, slurm_id)


def _drop(folder: Path) -> None:
    """Remove a probe's folder and the tokens it placed elsewhere."""
    folder_probe.remove(folder)
    shutil.rmtree(folder, ignore_errors=True)


def probe_answer(executor: SlurmExecutor, probe: Handle) -> bool | None:
    """True once the probe job read every token back (its folder is removed); None while it waits or
    runs; False when it was cancelled before it could tell (no verdict); :class:`ExecutorError` naming
    the folders (``job_dir``, else each other one it could not read) and the node where the job did not
    see them. The tokens in other folders are removed once it answers."""
    status = executor.poll(probe)
    if isinstance(status, Active):
        return None
    token = ""
    seen = ""
    with contextlib.suppress(OSError):
        token = (probe.job_dir / "token").read_text(encoding="utf-8")
    with contextlib.suppress(OSError):
        seen = (probe.job_dir / "seen").read_text(encoding="utf-8")
    node = status.placement.nodes or "its node"
    if token and seen.split(" ", 1)[0] == token:
        missed = folder_probe.unread(probe.job_dir, token, seen)
        _drop(probe.job_dir)
        if missed:
            raise ExecutorError(
                folder_probe.not_shared(missed, nodes="the compute nodes", runner=f"a job on {node}")
            )
        return True
    if status.kind is EndKind.CANCELLED:
        _drop(probe.job_dir)
        return False
    # Kept for its script (and removed by the clean-up, as a failed job's folder is); not its tokens.
    folder_probe.remove(probe.job_dir)
    if status.kind is not EndKind.FAILED:
        raise ExecutorError(f"the job folder probe did not run to its end: {status.detail}")
    raise ExecutorError(
        f"executor.job_dir {executor.job_dir} is not shared with the compute nodes: a job on {node} "
        f"could not read {probe.job_dir / 'token'} (mount the folder there, or pick one that is)"
    )
