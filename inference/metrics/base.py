"""What a metric is: a pure function from one evaluation's plain records to an aggregate with its noise.

A :class:`SampleMetric` scores each sample and aggregates the scores (mean and standard error by
default); a :class:`RunMetric` reads the run as a whole (timings). Every aggregate carries ``n`` and a
standard error where one has meaning, so anomaly detectors know the noise floor.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from inference.spec import MetricValue


@dataclass(frozen=True)
class SampleRecord:
    correct: bool
    #: Generated tokens, EOS and padding not counted.
    tokens: int
    truncated: bool


@dataclass(frozen=True)
class EvalRecord:
    samples: tuple[SampleRecord, ...]
    #: Seconds spent in generation (the sum of the batches).
    generation_s: float
    load_s: float
    #: The whole evaluation, dataset and model loading included.
    wall_s: float


class Metric(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    #: Which way is better: what "new best" and "regression" mean. ``None`` for metrics with no good
    #: direction (response length).
    higher_is_better: ClassVar[bool | None]

    @abstractmethod
    def compute(self, record: EvalRecord) -> MetricValue: ...


def mean_with_stderr(name: str, values: Sequence[float]) -> MetricValue:
    """Mean, with the standard error from the sample standard deviation (none below two values)."""
    n = len(values)
    if n == 0:
        return MetricValue(name=name, value=0.0, n=0, stderr=None)
    mean = math.fsum(values) / n
    if n < 2:
        return MetricValue(name=name, value=mean, n=n, stderr=None)
    variance = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return MetricValue(name=name, value=mean, n=n, stderr=math.sqrt(variance / n))


def proportion_with_stderr(name: str, hits: Sequence[bool]) -> MetricValue:
    """Share of hits, with the binomial standard error ``sqrt(p (1 - p) / n)``."""
    n = len(hits)
    if n == 0:
        return MetricValue(name=name, value=0.0, n=0, stderr=None)
    p = sum(hits) / n
    return MetricValue(name=name, value=p, n=n, stderr=math.sqrt(p * (1.0 - p) / n))


class SampleMetric(Metric):
    """Scores each sample; aggregates by mean and standard error unless a subclass knows better."""

    @abstractmethod
    def score(self, sample: SampleRecord) -> float: ...

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return mean_with_stderr(self.name, scores)

    def compute(self, record: EvalRecord) -> MetricValue:
        return self.aggregate([self.score(sample) for sample in record.samples])


class RunMetric(Metric):
    """Reads the evaluation as a whole; no per-sample values, so no standard error."""
