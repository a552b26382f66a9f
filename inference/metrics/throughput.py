"""Efficiency: throughput, batch latency, memory, and where the evaluation's time went."""

from __future__ import annotations

from typing import ClassVar

from inference.metrics.base import EvalRecord, RunMetric, no_value, percentile
from inference.spec import MetricValue


class TokensPerSecond(RunMetric):
    name = "tokens_per_s"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "tokens generated (or scored, for likelihood) per second in the model"

    def compute(self, record: EvalRecord) -> MetricValue:
        tokens = sum(s.tokens for s in record.samples) + sum(d.tokens for d in record.documents)
        n = len(record.samples) or len(record.documents)
        if n == 0 or record.generation_s <= 0:
            return no_value(self.name)
        return MetricValue(name=self.name, value=tokens / record.generation_s, n=n)


class BatchLatency(RunMetric):
    """A percentile of the per-batch latency (``latency_p50_s``, ``latency_p95_s``); n is the batches."""

    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "a percentile of the seconds one batch took"

    def __init__(self, q: int) -> None:
        self.q = q
        self.name = f"latency_p{q}_s"

    def compute(self, record: EvalRecord) -> MetricValue:
        latencies = record.batch_latencies_s
        if not latencies:
            return no_value(self.name)
        return MetricValue(name=self.name, value=percentile(latencies, self.q), n=len(latencies))


class PeakMemory(RunMetric):
    name = "peak_memory_mb"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = (
        "peak memory while evaluating, MiB (GPU: allocated by torch; CPU: resident set)"
    )

    def compute(self, record: EvalRecord) -> MetricValue:
        if record.peak_memory_mb is None:
            # Not measured here: absent, not 0 MiB.
            return no_value(self.name)
        return MetricValue(name=self.name, value=record.peak_memory_mb)


class WallTime(RunMetric):
    name = "wall_s"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "seconds for the whole evaluation, loading included"

    def compute(self, record: EvalRecord) -> MetricValue:
        return MetricValue(name=self.name, value=record.wall_s)


class LoadTime(RunMetric):
    name = "load_s"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "seconds to load model and tokenizer"

    def compute(self, record: EvalRecord) -> MetricValue:
        return MetricValue(name=self.name, value=record.load_s)
