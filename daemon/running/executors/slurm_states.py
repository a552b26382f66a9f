"""What Slurm's word on a job means for evald: a state from ``scontrol``/``sacct`` as an :class:`Active` or
:class:`Ended`, or, once Slurm has forgotten the job, its end from what the batch script left in the job
folder (``exit.json``, ``result.json``). Pure functions of a :class:`SlurmJob` and the folder's files.

Slurm states and what they become::

    PENDING, CONFIGURING, RESV_DEL_HOLD        Active PENDING (REQUEUED once the job was requeued)
    REQUEUED, REQUEUE_FED, REQUEUE_HOLD        Active REQUEUED
    RUNNING, COMPLETING, RESIZING, ...         Active RUNNING
    SUSPENDED, STOPPED                         Active HELD
    COMPLETED                                  SUCCEEDED with a result.json, else FAILED
    FAILED, SPECIAL_EXIT, REVOKED              FAILED (OUT_OF_MEMORY for the worker's exit status 4)
    TIMEOUT, DEADLINE                          TIMEOUT
    PREEMPTED / NODE_FAIL, BOOT_FAIL           PREEMPTED / NODE_FAIL
    OUT_OF_MEMORY / CANCELLED                  OUT_OF_MEMORY / CANCELLED (by evald, or by someone)
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

from daemon.running.executors.base import Active, Ended, EndKind, Handle, Phase, Placement, Status
from daemon.running.executors.job_dirs import exit_code, result
from daemon.running.executors.slurm_output import SlurmJob
from daemon.running.executors.slurm_script import EXIT_NAME, LOG_NAME
from daemon.running.workers import stderr_tail
from inference.spec import EXIT_OUT_OF_MEMORY

# srun's word on a rank that failed: "srun: error: node3: task 1: Exited with exit code 3".
_SRUN_TASK = re.compile(r"srun: error: \S+: tasks? (\d+)(?:-\d+)?: (?:Exited with exit code (\d+)|Killed|.*)")

_PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "RESV_DEL_HOLD"})
_RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT"})
_REQUEUED_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})
_HELD_STATES = frozenset({"SUSPENDED", "STOPPED"})
_ENDS = {
    "TIMEOUT": EndKind.TIMEOUT,
    "DEADLINE": EndKind.TIMEOUT,
    "PREEMPTED": EndKind.PREEMPTED,
    "NODE_FAIL": EndKind.NODE_FAIL,
    "BOOT_FAIL": EndKind.NODE_FAIL,
    "OUT_OF_MEMORY": EndKind.OUT_OF_MEMORY,
    "CANCELLED": EndKind.CANCELLED,
}


def status(job: SlurmJob, handle: Handle, cancelled: Collection[str] = ()) -> Status:
    """What ``job`` (Slurm's record of ``handle``'s job) says; ``cancelled``: the Slurm job ids evald
    cancelled itself (their CANCELLED is evald's, not someone's)."""
    placement = placement_of(job)
    state = job.state
    if state in _PENDING_STATES:
        phase = Phase.REQUEUED if job.restarts else Phase.PENDING
        return Active(phase, job.reason, placement)
    if state in _REQUEUED_STATES:
        return Active(Phase.REQUEUED, job.reason, placement)
    if state in _RUNNING_STATES:
        return Active(Phase.RUNNING, None, placement)
    if state in _HELD_STATES:
        return Active(Phase.HELD, job.reason, placement)
    where = f" on {job.nodes}" if job.nodes else ""
    limit = f" (limit {clock(job.time_limit_s)})" if job.time_limit_s else ""
    ran = f" after {clock(job.run_s)}" if job.run_s is not None else ""
    if state == "COMPLETED":
        return exited(handle, 0, placement, f"Slurm job {job.job_id} COMPLETED{ran}{where}")
    if state in {"FAILED", "SPECIAL_EXIT", "REVOKED"}:
        code = job.exit_code if job.exit_code is not None else exit_code(handle.job_dir)
        detail = f"Slurm job {job.job_id} {state}{ran}{where}: {_describe(code, job.exit_signal)}"
        return exited(handle, code, placement, detail)
    kind = _ENDS.get(state, EndKind.FAILED)
    detail = f"Slurm job {job.job_id} {state}{ran}{where}{limit if kind is EndKind.TIMEOUT else ''}"
    if kind is EndKind.CANCELLED:
        who = "by evald" if job.job_id in cancelled else "outside evald (scancel)"
        detail = f"Slurm job {job.job_id} cancelled {who}{' while pending' if not job.nodes else ran}"
    return Ended(
        kind,
        detail,
        exit_code=job.exit_code,
        log_tail=log_tail(handle.job_dir),
        placement=placement,
    )


def exited(handle: Handle, code: int | None, placement: Placement, detail: str) -> Ended:
    """The end of a job whose worker exited with ``code``: SUCCEEDED only with a result written."""
    if code == 0:
        if result(handle.job_dir) is not None:
            return Ended(EndKind.SUCCEEDED, detail, exit_code=0, placement=placement)
        return Ended(
            EndKind.FAILED,
            f"{detail}, but the worker wrote no result.json",
            exit_code=0,
            log_tail=log_tail(handle.job_dir),
            placement=placement,
        )
    kind = EndKind.OUT_OF_MEMORY if code == EXIT_OUT_OF_MEMORY else EndKind.FAILED
    return Ended(kind, detail, exit_code=code, log_tail=log_tail(handle.job_dir), placement=placement)


def from_folder(handle: Handle) -> Ended:
    """The job's end from what its script left, once Slurm has forgotten it and has no accounting."""
    code = exit_code(handle.job_dir)
    forgotten = f"Slurm job {handle.external_id} is no longer known to the controller"
    if code is not None:
        return exited(handle, code, Placement(), f"{forgotten}; its script exited {code}")
    if result(handle.job_dir) is not None:
        return Ended(EndKind.SUCCEEDED, f"{forgotten}; its result was written", placement=Placement())
    return Ended(
        EndKind.LOST,
        f"{forgotten} (it forgets ended jobs after MinJobAge) and left no {EXIT_NAME} in "
        f"{handle.job_dir}; sacct has no record either",
        log_tail=log_tail(handle.job_dir),
    )


def finished_here(handle: Handle, last: Placement) -> Ended | None:
    """The job's success as its folder tells it, before Slurm is asked: the script wrote ``exit.json``
    with exit status 0 (after the worker, so its result is whole) and the result holds no error. None
    otherwise: a failure's kind (out of memory, a node that failed, a time limit) is Slurm's to say.
    ``last``: where the last poll saw the job (its node, its start), kept for the history."""
    path = handle.job_dir / EXIT_NAME
    try:
        written = path.stat().st_mtime
    except OSError:
        return None
    if exit_code(handle.job_dir) != 0 or result(handle.job_dir) is None:
        return None
    state = "COMPLETED"
    placement = Placement(
        state=state,
        nodes=last.nodes,
        partition=last.partition,
        submitted=last.submitted,
        started=last.started,
        ended=written,
        restarts=last.restarts,
    )
    where = f" on {last.nodes}" if last.nodes else ""
    return Ended(
        EndKind.SUCCEEDED,
        f"Slurm job {handle.external_id} COMPLETED{where} (its {EXIT_NAME} read as it was written)",
        exit_code=0,
        placement=placement,
    )


def log_tail(folder: Path) -> str:
    """The end of the failed rank's log, where srun named one, else of the batch log."""
    batch = stderr_tail(folder / LOG_NAME, limit=20000)
    for match in _SRUN_TASK.finditer(batch):
        rank_log = folder / f"rank-{match.group(1)}.log"
        if rank_log.is_file():
            return f"rank {match.group(1)} failed; its log ends: {stderr_tail(rank_log)}"
    return stderr_tail(folder / LOG_NAME)


def placement_of(job: SlurmJob) -> Placement:
    return Placement(
        state=job.state,
        nodes=job.nodes,
        partition=job.partition,
        submitted=job.submit_time,
        started=job.start_time,
        ended=job.end_time,
        restarts=job.restarts,
    )


def _describe(code: int | None, signal: int | None) -> str:
    if signal:
        return f"killed by signal {signal}"
    return "exit status unknown" if code is None else f"exit status {code}"


def clock(seconds: float | None) -> str:
    """``H:MM:SS``."""
    total = int(seconds or 0)
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"
