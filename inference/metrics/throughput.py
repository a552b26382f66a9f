"""Efficiency: generation throughput and where the evaluation's time went."""

from __future__ import annotations

from typing import ClassVar

from inference.metrics.base import EvalRecord, RunMetric
from inference.spec import MetricValue


class TokensPerSecond(RunMetric):
    name: ClassVar[str] = "tokens_per_s"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "generated tokens per second of generation (loading excluded)"

    def compute(self, record: EvalRecord) -> MetricValue:
        tokens = sum(sample.tokens for sample in record.samples)
        rate = tokens / record.generation_s if record.generation_s > 0 else 0.0
        return MetricValue(name=self.name, value=rate, n=len(record.samples))


class WallTime(RunMetric):
    name: ClassVar[str] = "wall_s"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "seconds for the whole evaluation, loading included"

    def compute(self, record: EvalRecord) -> MetricValue:
        return MetricValue(name=self.name, value=record.wall_s)


class LoadTime(RunMetric):
    name: ClassVar[str] = "load_s"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "seconds to load model and tokenizer"

    def compute(self, record: EvalRecord) -> MetricValue:
        return MetricValue(name=self.name, value=record.load_s)
