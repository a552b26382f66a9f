"""What a metric is: a pure function from one evaluation's plain records to an aggregate with its noise.

A :class:`SampleMetric` scores each sample and aggregates the scores (mean and standard error by
default); a :class:`GroupMetric` scores each prompt's group of ``n_samples`` completions; a
:class:`RunMetric` reads the run as a whole (timings). Every aggregate carries ``n`` (what it averages
over: samples, prompts, batches or documents) and a standard error where one has meaning, so anomaly
detectors know the noise floor. Samples that failed (their reward raised, say) never reach a metric: the
task leaves them out and reports them, so every metric of a job is over the same samples.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from inference.spec import MetricValue, TaskKind

# A code task generates too: every metric of generated responses applies to it (accuracy is then the share
# of samples that pass all their tests).
GENERATE: frozenset[TaskKind] = frozenset({"generate", "code"})
CODE: frozenset[TaskKind] = frozenset({"code"})
LIKELIHOOD: frozenset[TaskKind] = frozenset({"likelihood"})
ANY_KIND: frozenset[TaskKind] = frozenset({"generate", "code", "likelihood"})


@dataclass(frozen=True)
class SampleRecord:
    """One generated response, graded."""

    correct: bool
    #: Generated tokens, EOS and padding not counted.
    tokens: int
    truncated: bool
    #: The prompt's position in the eval set: the ``n_samples`` completions of a prompt share it.
    group: int
    response: str = ""
    reference: str = ""
    #: The final answer math-verify found in the response; ``None`` if none.
    answer: str | None = None
    reward: float | None = None
    #: Sum of the policy's per-token entropies (nats) over ``entropy_tokens`` decoding steps.
    entropy_sum: float = 0.0
    entropy_tokens: int = 0
    #: Code tasks: the sample's tests that passed, the tests run, and its verdict (``passed``, or its
    #: first failing test's, see :mod:`inference.code.grading`).
    tests_passed: int = 0
    tests_total: int = 0
    verdict: str | None = None


@dataclass(frozen=True)
class DocumentRecord:
    """One held-out text, scored by the model."""

    #: Summed negative log-likelihood of the scored tokens, in nats.
    nll: float
    #: Tokens scored (every token after the first).
    tokens: int
    #: Words (whitespace-separated, as lm-eval counts them) and UTF-8 bytes of the text scored.
    words: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class EvalRecord:
    samples: tuple[SampleRecord, ...] = ()
    documents: tuple[DocumentRecord, ...] = ()
    #: Seconds spent in the model (generating or scoring): the sum of the batches.
    generation_s: float = 0.0
    #: Seconds each batch took.
    batch_latencies_s: tuple[float, ...] = ()
    load_s: float = 0.0
    #: The whole evaluation, dataset and model loading included.
    wall_s: float = 0.0
    #: Highest memory in use while evaluating (device memory on a GPU, resident set on the CPU).
    peak_memory_mb: float | None = None


class Metric(ABC):
    name: str
    description: ClassVar[str]
    #: Which way is better: what "new best" and "regression" mean. ``None`` for metrics with no good
    #: direction (response length).
    higher_is_better: ClassVar[bool | None]
    #: The task kinds it applies to.
    kinds: ClassVar[frozenset[TaskKind]] = GENERATE
    #: Completions per prompt it needs (pass@k needs k).
    min_samples_per_prompt: int = 1
    #: Whether a value over no samples is still reported (``n = 0``, no number): "no samples" is news
    #: about the checkpoint (no answer was correct, so no correct answers' length). A timing that was not
    #: measured here (peak memory on a CPU) is no news, and is left out.
    reports_no_samples: ClassVar[bool] = True

    @abstractmethod
    def compute(self, record: EvalRecord) -> MetricValue: ...


def no_value(name: str) -> MetricValue:
    """What a metric computed over nothing gives (a mean over zero samples, a rate over no time): ``n = 0``
    and no number. It is NaN, not 0, so that it can never pass for a value: it is stored as a row that
    says "no samples" (no number, so never plotted as a point, fed to a detector or exported as one)."""
    return MetricValue(name=name, value=math.nan, n=0, stderr=None)


def present(value: MetricValue) -> bool:
    """Whether ``value`` is a value at all (``n = 0``: computed over nothing, see :func:`no_value`)."""
    return value.n != 0


def is_binary(values: Sequence[float]) -> bool:
    """Every value is 0 or 1: their mean is a proportion (a 0/1 reward is the same grade as accuracy)."""
    return bool(values) and all(v == 0.0 or v == 1.0 for v in values)


def mean_with_stderr(name: str, values: Sequence[float]) -> MetricValue:
    """Mean, with the standard error from the sample standard deviation (none below two values). A mean of
    0/1 values is a proportion and gets the proportion rule (:func:`proportion_with_stderr`): one rule
    per kind of metric, whatever the metric is called."""
    n = len(values)
    if n == 0:
        return no_value(name)
    if is_binary(values):
        return proportion_with_stderr(name, [v == 1.0 for v in values])
    mean = math.fsum(values) / n
    if n < 2:
        return MetricValue(name=name, value=mean, n=n, stderr=None)
    return MetricValue(name=name, value=mean, n=n, stderr=sample_std(values) / math.sqrt(n))


def sample_std(values: Sequence[float]) -> float:
    """Standard deviation with Bessel's correction (as ``torch.std``, which GRPO normalises by)."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def proportion_with_stderr(name: str, hits: Sequence[bool]) -> MetricValue:
    """Share of hits, with the Agresti–Coull standard error ``sqrt(q (1 - q) / (n + 4))``, ``q = (hits + 2)
    / (n + 4)``. The plain binomial ``sqrt(p (1 - p) / n)`` is 0 at p = 0 or 1, which would make a first
    truncated answer (0 → 0.2%) an infinitely significant change; the two agree away from the edges."""
    n = len(hits)
    if n == 0:
        return no_value(name)
    p = sum(hits) / n
    q = (sum(hits) + 2) / (n + 4)
    return MetricValue(name=name, value=p, n=n, stderr=math.sqrt(q * (1.0 - q) / (n + 4)))


def ratio_with_stderr(name: str, numerators: Sequence[float], denominators: Sequence[float]) -> MetricValue:
    """``sum(numerators) / sum(denominators)`` over units (a per-token mean over responses, say), with the
    ratio estimator's standard error: units are the independent draws, not the tokens within them."""
    n = len(numerators)
    total = math.fsum(denominators)
    if n == 0 or total <= 0:
        # Nothing to divide by (no tokens scored): no value, not 0.
        return no_value(name)
    ratio = math.fsum(numerators) / total
    if n < 2:
        return MetricValue(name=name, value=ratio, n=n, stderr=None)
    residuals = math.fsum((y - ratio * x) ** 2 for y, x in zip(numerators, denominators, strict=True))
    stderr = math.sqrt(residuals / (n * (n - 1))) / (total / n)
    return MetricValue(name=name, value=ratio, n=n, stderr=stderr)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) by linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def groups(samples: Sequence[SampleRecord]) -> list[list[SampleRecord]]:
    """The samples of each prompt, in the prompts' order."""
    by_group: dict[int, list[SampleRecord]] = {}
    for sample in samples:
        by_group.setdefault(sample.group, []).append(sample)
    return [by_group[group] for group in sorted(by_group)]


def clustered_stderr(groups: Sequence[Sequence[float]]) -> float | None:
    """Standard error of the mean of all ``groups``' values when values within a group are correlated
    (the completions of one prompt): the ratio estimator with the groups as the independent draws."""
    kept = [group for group in groups if group]
    stderr = ratio_with_stderr("", [math.fsum(g) for g in kept], [float(len(g)) for g in kept]).stderr
    return stderr


class SampleMetric(Metric):
    """Scores each sample; aggregates by mean and standard error unless a subclass knows better.

    With several completions per prompt the samples are not independent draws (a prompt the model cannot
    solve fails all of its completions), so the standard error is computed over prompts; the value is
    still the mean over samples, and ``n`` the samples."""

    @abstractmethod
    def score(self, sample: SampleRecord) -> float | None:
        """The sample's score; ``None`` leaves it out of this metric (a correct-only mean, say)."""

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return mean_with_stderr(self.name, scores)

    def compute(self, record: EvalRecord) -> MetricValue:
        by_group: dict[int, list[float]] = {}
        for sample in record.samples:
            score = self.score(sample)
            if score is not None:
                by_group.setdefault(sample.group, []).append(score)
        scores = [score for group in by_group.values() for score in group]
        result = self.aggregate(scores)
        if result.stderr is None or all(len(group) == 1 for group in by_group.values()):
            return result
        clustered = clustered_stderr(list(by_group.values()))
        if clustered is not None and is_binary(scores):
            # A proportion keeps the Agresti–Coull floor: the clustered error of an all-correct run is 0.
            clustered = max(clustered, result.stderr)
        return result.model_copy(update={"stderr": clustered})


class GroupMetric(Metric):
    """Scores each prompt from its completions; the mean over prompts, ``n`` the prompts counted."""

    @abstractmethod
    def score(self, group: Sequence[SampleRecord]) -> float | None:
        """The prompt's score; ``None`` leaves it out (too few completions survived)."""

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return mean_with_stderr(self.name, scores)

    def compute(self, record: EvalRecord) -> MetricValue:
        scores = [self.score(group) for group in groups(record.samples)]
        return self.aggregate([score for score in scores if score is not None])


class RunMetric(Metric):
    """Reads the evaluation as a whole; no per-sample values, so no standard error."""

    kinds: ClassVar[frozenset[TaskKind]] = ANY_KIND
    reports_no_samples: ClassVar[bool] = False
