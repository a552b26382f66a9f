"""Answer quality: math-verify accuracy, and exact match of the final answer as written."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import ClassVar

from inference.metrics.base import SampleMetric, SampleRecord, proportion_with_stderr
from inference.spec import MetricValue


class Accuracy(SampleMetric):
    name = "accuracy"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "share of answers graded correct by math-verify"

    def score(self, sample: SampleRecord) -> float:
        return 1.0 if sample.correct else 0.0

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return proportion_with_stderr(self.name, [score == 1.0 for score in scores])


def last_boxed(text: str) -> str | None:
    """The contents of the last ``\\boxed{…}`` (or ``\\fbox{…}``) in ``text``, braces balanced; ``None``
    if there is none or it never closes."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    opening = text.index("{", start)
    depth = 0
    for position in range(opening, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[opening + 1 : position]
    return None


def normalise(text: str) -> str:
    """Whitespace and enclosing ``$`` do not count; everything else does (``0.5`` is not ``1/2``)."""
    return re.sub(r"\s+", "", text).strip("$")


def final_answer(response: str) -> str:
    """What the model wrote as its final answer: the last boxed expression, else the whole response."""
    boxed = last_boxed(response)
    return response if boxed is None else boxed


class ExactMatch(SampleMetric):
    name = "exact_match"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = (
        "share of final answers (the last \\boxed{}, else the response) equal to the reference as text, "
        "whitespace and enclosing $ aside"
    )

    def score(self, sample: SampleRecord) -> float:
        return 1.0 if normalise(final_answer(sample.response)) == normalise(sample.reference) else 0.0

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return proportion_with_stderr(self.name, [score == 1.0 for score in scores])
