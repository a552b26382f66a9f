"""pass@k and maj@k over the n completions of one prompt: pure estimators, no records.

pass@k is the Codex paper's unbiased estimator (Chen et al. 2021): the chance that at least one of k
completions drawn without replacement from the n generated is correct, ``1 - C(n-c, k) / C(n, k)``,
computed as a product so that large n does not overflow.

maj@k takes the first k completions' extracted answers, and the prompt counts as solved when the most
frequent answer is correct. A tie between answers is credited with the share of the tied answers that
are correct: the expected score of breaking the tie at random, so the result does not depend on the
order the completions came in. Completions without an extracted answer do not vote.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import ClassVar

from inference.metrics.base import GroupMetric, SampleRecord


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one prompt with ``c`` correct of ``n`` completions."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int) -> float:
    """maj@k for one prompt: ``answers[i]`` (None: none extracted) was graded ``correct[i]``."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} grades")
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= n, got k={k}, n={len(answers)}")
    votes = Counter(answer for answer in answers[:k] if answer is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [answer for answer, count in votes.items() if count == top]
    graded = {answer: ok for answer, ok in zip(answers[:k], correct[:k], strict=True) if answer is not None}
    return sum(graded[answer] for answer in tied) / len(tied)


class PassAtK(GroupMetric):
    """pass@k per prompt, averaged over the prompts with at least k completions."""

    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "chance that at least one of k completions is correct (unbiased estimator)"

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"pass@{k}"
        self.min_samples_per_prompt = k

    def score(self, group: Sequence[SampleRecord]) -> float | None:
        if len(group) < self.k:
            return None
        return pass_at_k(len(group), sum(sample.correct for sample in group), self.k)


class MajorityAtK(GroupMetric):
    """maj@k per prompt, averaged over the prompts with at least k completions."""

    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "share of prompts whose most frequent answer among k completions is correct"

    def __init__(self, k: int) -> None:
        self.k = k
        self.name = f"maj@{k}"
        self.min_samples_per_prompt = k

    def score(self, group: Sequence[SampleRecord]) -> float | None:
        if len(group) < self.k:
            return None
        return majority_at_k([s.answer for s in group], [s.correct for s in group], self.k)
