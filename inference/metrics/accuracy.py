"""Accuracy: the share of samples whose final answer math-verify judged equal to the reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from inference.metrics.base import SampleMetric, SampleRecord, proportion_with_stderr
from inference.spec import MetricValue


class Accuracy(SampleMetric):
    name: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "share of answers graded correct by math-verify"

    def score(self, sample: SampleRecord) -> float:
        return 1.0 if sample.correct else 0.0

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return proportion_with_stderr(self.name, [score == 1.0 for score in scores])
