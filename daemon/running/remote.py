"""Jobs run by an executor other than the daemon's own processes (Slurm): what the runner makes of the
executor's answers.

Pure functions over the executor's :class:`Ended` and :class:`Active` and the job's files: how an end
becomes the runner's :class:`Outcome` (the same kinds a local worker's end has, so that the retry and
storing rules are one), and the one line ``evald status`` shows for a job still queued or running.

Scheduler ends and the outcome kinds they become::

    SUCCEEDED      the worker's result (read like a local worker's)
    FAILED         the worker's own error kind (checkpoint_invalid, out_of_memory, ...), else crash with
                   the scheduler's line and the failed rank's log tail
    TIMEOUT        timeout          (retried within max_attempts with a longer time limit, up to
                                     max_time_limit; at it the job fails)
    PREEMPTED      preempted        (back to the queue without spending an attempt, free_preemptions
                                     times in a row; past them retried like a failure)
    NODE_FAIL      node_fail        (retried within max_attempts, its nodes excluded)
    OUT_OF_MEMORY  out_of_memory    (rerun at half the batch size, like a local one)
    LOST           lost             (retried: the scheduler forgot it and it left no exit status)
    CANCELLED      cancelled        (not retried: someone meant it)
    INFEASIBLE     infeasible       (not retried: no node can hold what it asks for; it fails, and its
                                     eval_failed alert fires)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from datetime import datetime

from daemon.config import Config
from daemon.running.environment import worker_environment
from daemon.running.executors.base import Active, Ended, EndKind, Phase
from daemon.running.executors.slurm import SlurmExecutor
from daemon.running.executors.slurm_script import LOG_NAME
from daemon.running.workers import Outcome, crash_cause, read_outcome
from inference.spec import JobSpec

_KINDS = {
    EndKind.TIMEOUT: "timeout",
    EndKind.PREEMPTED: "preempted",
    EndKind.NODE_FAIL: "node_fail",
    EndKind.OUT_OF_MEMORY: "out_of_memory",
    EndKind.LOST: "lost",
    EndKind.CANCELLED: "cancelled",
    EndKind.INFEASIBLE: "infeasible",
}


def make_executor(config: Config, environ: Mapping[str, str] | None = None) -> SlurmExecutor | None:
    """The executor ``[executor]`` asks for; None for ``local`` (the runner's own worker processes).

    The submission environment is the workers' (the job inherits it with ``--export=ALL``) plus
    ``SLURM_CONF`` where the daemon has one and the config names none: the Slurm tools need it to find
    the cluster."""
    if config.executor.kind != "slurm":
        return None
    source = os.environ if environ is None else environ
    env = worker_environment(config, source)
    if config.executor.slurm_conf is None and source.get("SLURM_CONF"):
        env["SLURM_CONF"] = source["SLURM_CONF"]
    return SlurmExecutor(
        config.executor,
        python=str(config.inference.python or sys.executable),
        env=env,
        default_time_limit_s=config.inference.job_timeout_secs,
        # The script is made of [inference] too (tp × dp, device, threads): a refusal is this pair's.
        setup_key=config.inference.model_dump_json(),
    )


def outcome_of(ended: Ended, spec: JobSpec) -> Outcome:
    """The runner's outcome of a job the scheduler says has ended (see the module's table)."""
    folder = spec.result_path.parent
    if ended.kind is EndKind.SUCCEEDED:
        outcome = read_outcome(spec, 0, folder / LOG_NAME)
        if outcome.result is not None:
            return outcome
        return Outcome(error_kind="crash", error=f"{ended.detail}: {outcome.error}")
    if ended.kind is EndKind.FAILED:
        code = ended.exit_code if ended.exit_code is not None else 1
        outcome = read_outcome(spec, code or 1, folder / LOG_NAME)
        if outcome.error_kind not in (None, "crash"):
            return outcome
        if not ended.log_tail:
            # The worker's own files named the cause (or said there is none) on their first line.
            error = f"{ended.detail}; {outcome.error}" if outcome.error else ended.detail
            return Outcome(error_kind="crash", error=error)
        cause = crash_cause(ended.log_tail)
        first = f"{ended.detail}: {cause}" if cause is not None else ended.detail
        return Outcome(error_kind="crash", error=f"{first}\nlog ends: {ended.log_tail}")
    if ended.kind is EndKind.OUT_OF_MEMORY:
        # The worker's own report (CUDA out of memory) says more than the scheduler's cgroup kill.
        own = read_outcome(spec, ended.exit_code or 1, folder / LOG_NAME)
        if own.error_kind == "out_of_memory":
            return own
    detail = ended.detail + (f"; log ends: {ended.log_tail}" if ended.log_tail else "")
    return Outcome(error_kind=_KINDS[ended.kind], error=detail)


#: The word of a job's stored scheduler state while its executor's controller does not answer.
UNKNOWN = "UNKNOWN"


def unknown_line(since: datetime, what: str, last: str | None) -> str:
    """``UNKNOWN since 2026-05-01T10:00:00Z (the Ray head at … does not answer; last RUNNING on a)``: a
    job's state for ``evald status`` while ``what`` is away since ``since`` (UTC), with the last state
    the scheduler gave, if any."""
    seen = f"; last {last}" if last and not last.startswith(UNKNOWN) else ""
    return f"{UNKNOWN} since {since:%Y-%m-%dT%H:%M:%SZ} ({what} does not answer{seen})"


def state_line(status: Active) -> str:
    """``PENDING (Resources)``, ``RUNNING on node1``, ``REQUEUED (BeginTime)``: for ``evald status``."""
    placement = status.placement
    word = placement.state or status.phase.value.upper()
    if status.phase is Phase.RUNNING:
        return f"{word} on {placement.nodes}" if placement.nodes else word
    return f"{word} ({status.reason})" if status.reason else word
