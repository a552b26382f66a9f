"""The metric registry: ``name → metric``.

Metrics are pure functions over plain records (:class:`EvalRecord`), with no model and no torch, so
each one is tested on hand-made data. Add one by writing a :class:`Metric` and listing it in
:data:`METRICS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from inference.errors import TaskInvalid
from inference.metrics.accuracy import Accuracy
from inference.metrics.base import EvalRecord, Metric, SampleRecord
from inference.metrics.length import ResponseLength, TruncationRate
from inference.metrics.throughput import LoadTime, TokensPerSecond, WallTime
from inference.spec import MetricValue

METRICS: Mapping[str, Metric] = {
    metric.name: metric
    for metric in (
        Accuracy(),
        ResponseLength(),
        TruncationRate(),
        TokensPerSecond(),
        WallTime(),
        LoadTime(),
    )
}


def resolve_metrics(names: Iterable[str]) -> tuple[Metric, ...]:
    """The metrics named, in order; an unknown name is :class:`TaskInvalid` listing the known ones."""
    metrics: list[Metric] = []
    for name in names:
        if name not in METRICS:
            known = ", ".join(sorted(METRICS))
            raise TaskInvalid(f"unknown metric {name!r} (known: {known})")
        if METRICS[name] in metrics:
            raise TaskInvalid(f"metric {name!r} is listed twice")
        metrics.append(METRICS[name])
    return tuple(metrics)


def compute_metrics(metrics: Iterable[Metric], record: EvalRecord) -> tuple[MetricValue, ...]:
    return tuple(metric.compute(record) for metric in metrics)


__all__ = [
    "METRICS",
    "EvalRecord",
    "Metric",
    "SampleRecord",
    "compute_metrics",
    "resolve_metrics",
]
