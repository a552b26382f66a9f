"""Response length, overall and for correct and incorrect answers, and how often answers ran out of tokens.

Length growing on wrong answers only is the signature of a policy that rambles when it is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from inference.metrics.base import SampleMetric, SampleRecord, proportion_with_stderr
from inference.spec import MetricValue


class ResponseLength(SampleMetric):
    name = "response_length"
    higher_is_better: ClassVar[bool | None] = None
    description: ClassVar[str] = "mean generated tokens per answer (EOS not counted)"

    def score(self, sample: SampleRecord) -> float:
        return float(sample.tokens)


class ResponseLengthCorrect(SampleMetric):
    name = "response_length_correct"
    higher_is_better: ClassVar[bool | None] = None
    description: ClassVar[str] = "mean generated tokens per answer graded correct"

    def score(self, sample: SampleRecord) -> float | None:
        return float(sample.tokens) if sample.correct else None


class ResponseLengthIncorrect(SampleMetric):
    name = "response_length_incorrect"
    higher_is_better: ClassVar[bool | None] = None
    description: ClassVar[str] = "mean generated tokens per answer graded wrong"

    def score(self, sample: SampleRecord) -> float | None:
        return None if sample.correct else float(sample.tokens)


class TruncationRate(SampleMetric):
    name = "truncation_rate"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "share of answers that hit max_new_tokens before EOS"

    def score(self, sample: SampleRecord) -> float:
        return 1.0 if sample.truncated else 0.0

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return proportion_with_stderr(self.name, [score == 1.0 for score in scores])
