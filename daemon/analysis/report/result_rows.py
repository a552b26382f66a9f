"""Stored results as a person or a program reads them: the ``evald results`` table, JSON and CSV, and the
per-checkpoint metric rows of the demo."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from daemon.analysis.report.cells import NO_SAMPLES, Format, jsonable, table

if TYPE_CHECKING:
    from storage.queries import ResultRow


def result_dicts(rows: Iterable[ResultRow]) -> list[dict[str, Any]]:
    # Field by field rather than asdict(), which deep-copies every value: 10x slower on the API's pages.
    out = []
    for row in rows:
        shown = {k: jsonable(getattr(row, k)) for k in RESULT_FIELDS}
        if row.no_samples:
            shown["value"] = None  # not the NaN stored for it: a mean over nothing has no value
        out.append(shown)
    return out


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
    "no_samples",
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
    headers = RESULT_FIELDS[:-1]  # the value cell says it
    return table(
        headers,
        ([NO_SAMPLES if f == "value" and r.no_samples else getattr(r, f) for f in headers] for r in rows),
    )


CheckpointKey = tuple[str, int | None, str, str]


def metrics_by_checkpoint(rows: Iterable[ResultRow]) -> dict[CheckpointKey, dict[str, float | None]]:
    """(run, step, checkpoint, task) → {metric: value}: one table row per evaluated checkpoint and task;
    ``None`` for a metric over no samples."""
    grouped: dict[CheckpointKey, dict[str, float | None]] = {}
    for row in rows:
        value = None if row.no_samples else row.value
        grouped.setdefault((row.run, row.step, row.checkpoint, row.task), {})[row.metric] = value
    return grouped
