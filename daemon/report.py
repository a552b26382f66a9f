"""Turning rows into what a person or a program reads: aligned tables, JSON, CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

from storage.queries import CheckpointRow, JobRow, ResultRow

Format = Literal["table", "json", "csv"]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def result_dicts(rows: Iterable[ResultRow]) -> list[dict[str, Any]]:
    return [{k: _jsonable(v) for k, v in asdict(row).items()} for row in rows]


RESULT_FIELDS = (
    "run",
    "checkpoint",
    "step",
    "epoch",
    "task",
    "stage",
    "metric",
    "value",
    "n",
    "stderr",
    "evaluated_at",
)


def results(rows: Sequence[ResultRow], fmt: Format) -> str:
    dicts = result_dicts(rows)
    if fmt == "json":
        return json.dumps(dicts, indent=1)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=RESULT_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(dicts)
        return buffer.getvalue().rstrip("\n")
    return table(RESULT_FIELDS, ([getattr(r, f) for f in RESULT_FIELDS] for r in rows))


CheckpointKey = tuple[str, int | None, str, str]


def metrics_by_checkpoint(rows: Iterable[ResultRow]) -> dict[CheckpointKey, dict[str, float]]:
    """(run, step, checkpoint, task) → {metric: value}: one table row per evaluated checkpoint and task."""
    grouped: dict[CheckpointKey, dict[str, float]] = {}
    for row in rows:
        grouped.setdefault((row.run, row.step, row.checkpoint, row.task), {})[row.metric] = row.value
    return grouped


def status(
    checkpoints: Sequence[CheckpointRow], jobs: Sequence[JobRow], runs: Sequence[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run in runs:
        run_checkpoints = [c for c in checkpoints if c.run == run]
        run_jobs = [j for j in jobs if j.run == run]
        out[run] = {
            "checkpoints": _count(c.state for c in run_checkpoints),
            "jobs": _count(j.state for j in run_jobs),
            "last_evaluated_step": max(
                (j.step for j in run_jobs if j.state == "succeeded" and j.step is not None), default=None
            ),
            "problems": [
                {"checkpoint": c.name, "step": c.step, "state": c.state, "reason": c.reason}
                for c in run_checkpoints
                if c.state in ("invalid", "vanished")
            ]
            + [
                {
                    "checkpoint": j.checkpoint,
                    "step": j.step,
                    "task": j.task,
                    "state": j.state,
                    "reason": j.error,
                }
                for j in run_jobs
                if j.state == "failed"
            ],
        }
    return out


def _count(states: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return dict(sorted(counts.items()))


def status_text(summary: Mapping[str, Any]) -> str:
    lines = []
    for run, info in summary.items():
        checkpoints = ", ".join(f"{k} {v}" for k, v in info["checkpoints"].items()) or "none"
        jobs = ", ".join(f"{k} {v}" for k, v in info["jobs"].items()) or "none"
        lines.append(f"run {run}: last evaluated step {_cell(info['last_evaluated_step'])}")
        lines.append(f"  checkpoints: {checkpoints}")
        lines.append(f"  jobs:        {jobs}")
        for problem in info["problems"]:
            what = problem["checkpoint"] + (f" [{problem['task']}]" if "task" in problem else "")
            lines.append(f"  {problem['state']}: {what}: {problem['reason']}")
    return "\n".join(lines)
