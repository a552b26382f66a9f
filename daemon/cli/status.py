"""``evald status``: the executor's controller where a daemon says it does not answer, checkpoints and
jobs by state per run, the resource thresholds now, the Slurm queue where jobs run through Slurm, and
each tracker's backlog."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from daemon.analysis import report
from daemon.analysis.report.status_lines import executor_text
from daemon.analysis.report.tracker_rows import trackers_text
from daemon.analysis.run_status import executor_summary, run_summaries, tracker_summaries
from daemon.cli.base import load, open_current, terminal_width

if TYPE_CHECKING:
    # Types only: the probe (psutil, NVML, structlog) is imported where a threshold is set.
    from daemon.config import Config
    from daemon.scheduling.resources import Check


def cmd_status(args: argparse.Namespace) -> int:
    config = load(args)
    database = open_current(config.database.url)
    try:
        with database.session() as session:
            runs = run_summaries(session, config, [r.name for r in config.runs])
            trackers = tracker_summaries(session, config)
            executor = executor_summary(session, config)
    finally:
        database.dispose()
    cluster = slurm_queue(config)
    check = resource_check(config)
    if args.format == "json":
        shown: dict[str, Any] = {
            "executor": executor,
            "runs": runs,
            "resources": report.resources(check),
            "trackers": trackers,
        }
        if cluster is not None:
            shown["slurm"] = cluster
        print(json.dumps(shown, indent=1))
    else:
        if executor_text(executor):
            print(executor_text(executor))
        print(report.status_text(runs, terminal_width()))
        print(report.resources_text(check))
        if cluster is not None:
            print(report.cluster_text(cluster))
        if trackers:
            print(trackers_text(trackers))
    return 0


def resource_check(config: Config) -> Check | None:
    """The thresholds as they stand now, read the way the daemon reads them before starting a job; None
    where none is set. The daemon's service, which builds the probe, is imported only where one is."""
    if not config.scheduling.resources.thresholds().any_set:
        return None
    from daemon.service import resource_probe

    probe = resource_probe(config)
    return probe.check() if probe is not None else None


def slurm_queue(config: Config) -> dict[str, Any] | None:
    """evald's jobs in the Slurm queue now (``[executor] kind = "slurm"``; None otherwise): id, evald job
    and attempt, run, state, reason, nodes; or the error that kept squeue from answering. The executors'
    code is imported only for a Slurm executor (the local one has no queue to show)."""
    if config.executor.kind != "slurm":
        return None
    from daemon.running import remote
    from daemon.running.executors.base import ExecutorError, ExecutorUnavailable
    from daemon.running.executors.slurm_output import SlurmError

    try:
        executor = remote.make_executor(config)
    except ExecutorError as exc:
        return {"partition": config.executor.partition, "prefix": "", "error": str(exc), "jobs": []}
    if executor is None:
        return None
    out: dict[str, Any] = {"partition": config.executor.partition, "prefix": config.executor.name_prefix}
    try:
        active = executor.active()
    except (ExecutorUnavailable, SlurmError) as exc:
        return {**out, "error": str(exc), "jobs": []}
    try:
        executor.check()
    except (ExecutorError, ExecutorUnavailable, SlurmError) as exc:
        # What keeps the daemon from submitting (no such partition): its jobs wait in evald's queue.
        out["problem"] = str(exc)
    out["jobs"] = [
        {
            "slurm_job_id": job.job_id,
            "job": ref.job_id,
            "attempt": ref.attempt,
            "run": ref.run,
            "state": job.state,
            "reason": job.reason,
            "nodes": job.nodes or None,
        }
        for ref, job in sorted(active, key=lambda pair: int(pair[1].job_id))
    ]
    return out
