"""``evald history``: every worker run of one job as a table or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from daemon.analysis.report.cells import one_line, table
from storage.queries import AttemptRow


def history(attempts: Sequence[AttemptRow], output: str) -> str:
    """Every worker run of one job, oldest first."""
    rows: list[dict[str, Any]] = [
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
    if output == "json":
        return json.dumps(rows, indent=1)
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
    cut = [
        {**r, "error": None if r["error"] is None else one_line(r["error"], HISTORY_ERROR_CHARS)}
        for r in rows
    ]
    return table(columns, [tuple(r[c] for c in columns) for r in cut])


#: The columns a job's history table gains when one of its attempts ran through Slurm.
SLURM_HISTORY_COLUMNS = ("slurm_job_id", "nodes", "queue_wait_s", "run_s", "exit_state")

#: How much of an attempt's error the table shows (``--format json`` shows all of it).
HISTORY_ERROR_CHARS = 100
