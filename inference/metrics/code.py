"""Code tasks: the share of tests passed, and what the failing samples failed with.

``pass@k`` is :class:`~inference.metrics.passk.PassAtK` over the samples' ``correct`` (every test passed).
``test_pass_rate`` gives partial credit: a sample's passed tests over its tests, averaged over samples.
Each ``VERDICT_rate`` is the share of samples whose verdict (their first failing test's) it is; with the
share that passed (``accuracy``) they sum to one. ``interfered_rate`` is the share of samples that tampered
with their tests or the judge's harness (a policy learning to game the judge): an alert rule can watch it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from inference.metrics.base import CODE, SampleMetric, SampleRecord, proportion_with_stderr
from inference.spec import MetricValue, TaskKind

#: The failing verdicts a rate is reported for (see :mod:`inference.code.grading`).
FAILURES = ("wrong_answer", "runtime_error", "compile_error", "timeout", "memory", "interfered")


class TestPassRate(SampleMetric):
    # Not a pytest test class, whatever its name.
    __test__ = False

    name = "test_pass_rate"
    kinds: ClassVar[frozenset[TaskKind]] = CODE
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "share of a sample's tests it passes, averaged over samples"

    def score(self, sample: SampleRecord) -> float | None:
        if sample.tests_total == 0:
            return None
        return sample.tests_passed / sample.tests_total


class VerdictRate(SampleMetric):
    """Share of samples whose verdict is ``verdict``."""

    kinds: ClassVar[frozenset[TaskKind]] = CODE
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "share of samples whose first failing test failed this way"

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.name = f"{verdict}_rate"

    def score(self, sample: SampleRecord) -> float | None:
        return None if sample.verdict is None else float(sample.verdict == self.verdict)

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return proportion_with_stderr(self.name, [score == 1.0 for score in scores])
