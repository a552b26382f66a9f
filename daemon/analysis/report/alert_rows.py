"""Stored alerts as ``evald alerts`` and the HTTP API show them: JSON objects and the table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from daemon.analysis.report.cells import one_line, table

if TYPE_CHECKING:
    from storage import alerting


def alert_json(row: alerting.AlertRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "run": row.run,
        "task": row.task,
        "metric": row.metric,
        "rule": row.rule,
        "severity": row.severity,
        "state": row.state,
        # ``step`` is the onset (kept for readers written before ``first_step``).
        "step": row.first_step,
        "first_step": row.first_step,
        "last_step": row.last_step,
        "resolved_step": row.resolved_step,
        "value": row.value,
        "baseline": row.baseline,
        "best_step": row.best_step,
        "rollback_step": row.rollback_step,
        "repeats": row.repeats,
        "message": row.message,
        "fired_at": row.fired_at.isoformat(),
        "resolved_at": None if row.resolved_at is None else row.resolved_at.isoformat(),
        "delivered": row.delivered,
        "queued": row.queued,
    }


def alert_steps(row: alerting.AlertRow) -> str:
    """``840`` (fired once), ``840..960`` (onset to the latest step it fired at), ``840..960 ok@1080``
    (resolved by step 1080's result)."""
    if row.first_step is None:
        steps = "-" if row.last_step is None else f"?..{row.last_step}"
    elif row.last_step is None or row.last_step == row.first_step:
        steps = str(row.first_step)
    else:
        steps = f"{row.first_step}..{row.last_step}"
    if row.resolved_step is not None:
        steps += f" ok@{row.resolved_step}"
    return steps


def alerts_text(rows: Sequence[alerting.AlertRow]) -> str:
    if not rows:
        return "no alerts"
    header = (
        "id",
        "run",
        "task",
        "rule",
        "metric",
        "sev",
        "state",
        "steps",
        "value",
        "baseline",
        "best",
        "rollback",
        "sent",
        "message",
    )
    body = [
        (
            row.id,
            row.run,
            row.task or "-",
            row.rule,
            row.metric or "-",
            row.severity,
            row.state,
            alert_steps(row),
            "-" if row.value is None else f"{row.value:.4g}",
            "-" if row.baseline is None else f"{row.baseline:.4g}",
            "-" if row.best_step is None else row.best_step,
            "-" if row.rollback_step is None else row.rollback_step,
            f"{row.delivered}/{row.queued}",
            one_line(row.message, 80),
        )
        for row in rows
    ]
    return table(header, body)
