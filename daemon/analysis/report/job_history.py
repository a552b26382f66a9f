"""``evald history``: every worker run of one job as a table or JSON, and where its current claim stands
(a submission still queued in Slurm has run nowhere yet, but has a Slurm job id and a wait)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from daemon.analysis.report.cells import first_line, table

if TYPE_CHECKING:
    from storage.queries import AttemptRow
    from storage.queries.retry import Submission


def history_rows(attempts: Sequence[AttemptRow], current: Submission | None = None) -> list[dict[str, Any]]:
    """``evald history --format json`` (and the API's ``/api/v1/jobs/{job}``): every worker run, oldest
    first, then the current claim or queueing where no row tells it yet (:func:`_current`)."""
    rows = _rows(attempts)
    now = None if current is None else _current(current, attempts)
    return rows if now is None else [*rows, now]


def history(
    attempts: Sequence[AttemptRow], output: str, current: Submission | None = None, width: int | None = None
) -> str:
    """Every worker run of one job, oldest first; then, with ``current``, the claim that has no row yet
    (running, or queued in a scheduler) or the job queued again with no run of it begun. In the table an
    error is one line: whole where it fits ``width`` (a terminal's columns; else ``HISTORY_ERROR_CHARS``),
    else its first line, cut to fit, with the count of lines left out; the JSON has them whole."""
    if output == "json":
        return json.dumps(history_rows(attempts, current), indent=1)
    rows = _rows(attempts)
    now = None if current is None else _current(current, attempts)
    columns: tuple[str, ...] = (
        "attempt",
        "outcome",
        "engine",
        "tp",
        "dp",
        "batch_size",
        "duration_s",
        "error_kind",
        "error",
    )
    if any(a.slurm_job_id is not None for a in attempts):
        columns = (*columns[:7], *SLURM_HISTORY_COLUMNS, *columns[7:])
    room = HISTORY_ERROR_CHARS
    if width is not None and rows:
        others = table(columns[:-1], [tuple(r[c] for c in columns[:-1]) for r in rows])
        room = max(MIN_ERROR_CHARS, width - max(len(line) for line in others.splitlines()) - 2)
    cut, left_out = [], False
    for r in rows:
        error = r["error"]
        flat = None if error is None else " ".join(error.split())
        if error is not None and flat is not None and len(flat) > room:
            # Too long for one line: its first line (what went wrong), and how many lines are left out.
            head, more = first_line(error, room)
            left_out = True
            error = head + (f" ({more} more line{'s' if more > 1 else ''})" if more else "")
        elif flat is not None:
            # A short error of a few lines (an OOM's detail on its second line) fits whole, on one line.
            error = flat
        cut.append({**r, "error": error})
    shown = table(columns, [tuple(r[c] for c in columns) for r in cut]) if rows else ""
    whole = None
    if left_out:
        job = f" {current.job_id}" if current is not None else ""
        whole = f"errors are cut to their first line: `evald history{job} --format json` shows them whole"
    line = None if now is None else _current_line(now)
    return "\n".join(part for part in (shown, whole, line) if part)


def _rows(attempts: Sequence[AttemptRow]) -> list[dict[str, Any]]:
    return [
        {
            "attempt": a.attempt,
            "outcome": a.outcome,
            "engine": a.engine,
            "tp": a.tp,
            "dp": a.dp,
            "batch_size": a.batch_size,
            "started_at": a.started_at.isoformat(),
            "duration_s": round(a.duration_s, 3),
            "error_kind": a.error_kind,
            "error": a.error,
            # The scheduler's view of a run through Slurm (None for a local worker).
            "slurm_job_id": a.slurm_job_id,
            "nodes": a.nodes,
            "queue_wait_s": None if a.queue_wait_s is None else round(a.queue_wait_s, 1),
            "run_s": None if a.run_s is None else round(a.run_s, 1),
            "exit_state": a.exit_state,
        }
        for a in attempts
    ]


def _current(job: Submission, attempts: Sequence[AttemptRow]) -> dict[str, Any] | None:
    """The job's claim that has no history row yet (running, or still queued in a scheduler), or the job
    queued again after its last row; None when the last row already tells where it stands. Its keys are
    a history row's, ``outcome`` being the job's state, plus ``claimed_by``, the scheduler's
    ``executor_state`` and ``since_claim_s``."""
    if job.state == "running":
        if attempts and attempts[-1].attempt == job.attempts and attempts[-1].outcome != "out_of_memory":
            return None
        attempt = job.attempts
    elif job.state in ("pending", "deferred") and (not attempts or attempts[-1].outcome in ENDED_OUTCOMES):
        attempt = job.attempts + 1
    else:
        return None
    running = job.state == "running"
    return {
        "attempt": attempt,
        "outcome": job.state,
        "engine": None,
        "tp": None,
        "dp": None,
        "batch_size": None,
        "started_at": job.started_at.isoformat() if running and job.started_at is not None else None,
        "duration_s": None,
        "error_kind": None,
        "error": None,
        "slurm_job_id": job.slurm_job_id if job.executor == "slurm" else None,
        "nodes": None,
        "queue_wait_s": None,
        "run_s": None,
        "exit_state": None,
        "claimed_by": job.claimed_by,
        "executor_state": job.executor_state,
        # In a scheduler's queue this is the wait so far; once on a node, the wait and the run together.
        "since_claim_s": None if job.waiting_s is None else round(job.waiting_s, 1),
    }


def _current_line(now: dict[str, Any]) -> str:
    attempt = now["attempt"]
    if now["outcome"] != "running":
        return f"attempt {attempt}: {now['outcome']}: queued, no daemon has claimed it yet"
    where = f"running under {now['claimed_by']}"
    if now["slurm_job_id"] is not None:
        where = f"submitted to Slurm as job {now['slurm_job_id']} by {now['claimed_by']}"
    said = f", {now['executor_state']}" if now["executor_state"] else ""
    waited = "" if now["since_claim_s"] is None else f", {now['since_claim_s']}s since its claim"
    return f"attempt {attempt}: {where}{said}{waited}, no end recorded yet"


#: A history row's outcomes after which the job waits for a new claim (automatic retries included).
ENDED_OUTCOMES = ("failed", "retried", "requeued", "cancelled", "lost")


#: The columns a job's history table gains when one of its attempts ran through Slurm.
SLURM_HISTORY_COLUMNS = ("slurm_job_id", "nodes", "queue_wait_s", "run_s", "exit_state")

#: How much of an attempt's error's first line the table shows where no terminal width is known
#: (``--format json`` shows all of it).
HISTORY_ERROR_CHARS = 100
#: The least of it shown however narrow the terminal.
MIN_ERROR_CHARS = 30
