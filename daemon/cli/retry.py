"""``evald retry``: put a failed or cancelled job back in the queue, by id or a run's at once.

The job is the same row made ``pending`` (:mod:`storage.queries.retry`): a running daemon claims it like
any queued job, its earlier attempts stay in ``evald history``, and retrying it again before it runs
queues nothing more.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict

import structlog

from daemon.analysis.report.cells import table
from daemon.cli.base import database_url, open_current
from daemon.errors import ConfigError, EvaldError
from storage import queries
from storage.queries.retry import RetryTarget, retry_job_rows

log = structlog.get_logger("daemon.cli.retry")


def _selection(args: argparse.Namespace) -> None:
    """One job by id, or a run and what of it: anything else is refused before the database is opened."""
    if args.job is not None:
        extra = [
            option
            for option, given in (
                ("--run", args.run is not None),
                ("--failed", args.failed),
                ("--cancelled", args.cancelled),
                ("--step", args.step is not None),
                ("--task", args.task is not None),
            )
            if given
        ]
        if extra:
            raise ConfigError(extra[0], [f"give a job id or --run R with its filters, not both ({args.job})"])
    elif args.run is None:
        raise ConfigError("retry", ["give a job id (evald retry 42) or a run (evald retry --run R --failed)"])
    elif not (args.failed or args.cancelled):
        raise ConfigError("--run", ["say which of the run's jobs: --failed, --cancelled or both"])


def cmd_retry(args: argparse.Namespace) -> int:
    _selection(args)
    database = open_current(database_url(args))
    try:
        with database.session() as session:
            if args.run is not None and not queries.run_exists(session, args.run):
                known = ", ".join(r.name for r in queries.run_rows(session)) or "none"
                raise EvaldError(f"no run {args.run!r} (runs: {known})")
            targets = retry_job_rows(
                session,
                job_id=args.job,
                run=args.run,
                failed=args.failed,
                cancelled=args.cancelled,
                step=args.step,
                task=args.task,
            )
    finally:
        database.dispose()
    if args.job is not None and not targets:
        raise EvaldError(f"no job {args.job} (see `evald status` for job ids)")
    for target in targets:
        if target.outcome == "queued":
            log.info(
                "job.retry_queued", job_id=target.job_id, run=target.run, step=target.step, task=target.task
            )
    refused = [t for t in targets if t.outcome == "refused"]
    if args.job is not None and refused:
        raise EvaldError(f"cannot retry: {refused[0].reason}")
    # A run's jobs whose checkpoint is gone are listed as refused beside those queued, not an error.
    print(_render(targets, args))
    return 0


def _render(targets: Sequence[RetryTarget], args: argparse.Namespace) -> str:
    if args.format == "json":
        return json.dumps([asdict(t) for t in targets], indent=1)
    queued = sum(t.outcome == "queued" for t in targets)
    if not targets:
        what = " or ".join(k for k, on in (("failed", args.failed), ("cancelled", args.cancelled)) if on)
        return f"run {args.run}: no {what} job to retry"
    lines = [f"{queued} job(s) queued again; the daemon runs them as it runs any queued job"]
    rows = [(t.job_id, t.run, t.step, t.task, t.stage, t.state, t.error_kind, _said(t)) for t in targets]
    lines.append(table(("job", "run", "step", "task", "stage", "was", "error_kind", "now"), rows))
    return "\n".join(lines)


def _said(target: RetryTarget) -> str:
    if target.outcome == "queued":
        return "queued"
    if target.outcome == "already_queued":
        return "already queued"
    return f"refused: {target.reason}"
