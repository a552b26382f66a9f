"""Response length: generated tokens per answer, and how often answers ran out of tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from inference.metrics.base import SampleMetric, SampleRecord, proportion_with_stderr
from inference.spec import MetricValue


class ResponseLength(SampleMetric):
    name: ClassVar[str] = "response_length"
    higher_is_better: ClassVar[bool | None] = None
    description: ClassVar[str] = "mean generated tokens per answer (EOS not counted)"

    def score(self, sample: SampleRecord) -> float:
        return float(sample.tokens)


class TruncationRate(SampleMetric):
    name: ClassVar[str] = "truncation_rate"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "share of answers that hit max_new_tokens before EOS"

    def score(self, sample: SampleRecord) -> float:
        return 1.0 if sample.truncated else 0.0

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return proportion_with_stderr(self.name, [score == 1.0 for score in scores])
