"""The task's reward, and the GRPO group statistics that say whether a batch would still teach anything.

GRPO normalises each completion's reward by its prompt group's mean and standard deviation: a group whose
completions all got the same reward has zero advantage and no gradient. ``group_zero_spread`` rising is the
early sign of a policy that has stopped exploring (or a reward that has saturated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from inference.metrics.base import (
    GroupMetric,
    SampleMetric,
    SampleRecord,
    no_value,
    percentile,
    proportion_with_stderr,
    sample_std,
)
from inference.spec import MetricValue


class Reward(SampleMetric):
    name = "reward"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "mean reward per response (the task's reward function)"

    def score(self, sample: SampleRecord) -> float | None:
        return sample.reward


class RewardStd(SampleMetric):
    name = "reward_std"
    higher_is_better: ClassVar[bool | None] = None
    description: ClassVar[str] = "standard deviation of the reward across responses"

    def score(self, sample: SampleRecord) -> float | None:
        return sample.reward

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        if len(scores) < 2:
            # One reward has no spread to measure (0 would claim they all agreed).
            return no_value(self.name)
        return MetricValue(name=self.name, value=sample_std(scores), n=len(scores))


class RewardPercentile(SampleMetric):
    """A point of the reward distribution (``reward_p10``, ``reward_p50``, ``reward_p90``)."""

    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "a percentile of the reward across responses"

    def __init__(self, q: int) -> None:
        self.q = q
        self.name = f"reward_p{q}"

    def score(self, sample: SampleRecord) -> float | None:
        return sample.reward

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        if not scores:
            return no_value(self.name)
        return MetricValue(name=self.name, value=percentile(scores, self.q), n=len(scores))


def _rewards(group: Sequence[SampleRecord]) -> list[float] | None:
    rewards = [sample.reward for sample in group if sample.reward is not None]
    # A spread needs two completions; a prompt left with one (the others failed) says nothing.
    return rewards if len(rewards) >= 2 else None


class GroupRewardStd(GroupMetric):
    name = "group_reward_std"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "mean over prompts of the standard deviation of their completions' rewards"
    min_samples_per_prompt = 2

    def score(self, group: Sequence[SampleRecord]) -> float | None:
        rewards = _rewards(group)
        return None if rewards is None else sample_std(rewards)


class GroupZeroSpread(GroupMetric):
    name = "group_zero_spread"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "share of prompts whose completions all got the same reward (no GRPO signal)"
    min_samples_per_prompt = 2

    def score(self, group: Sequence[SampleRecord]) -> float | None:
        rewards = _rewards(group)
        return None if rewards is None else float(max(rewards) == min(rewards))

    def aggregate(self, scores: Sequence[float]) -> MetricValue:
        return proportion_with_stderr(self.name, [score == 1.0 for score in scores])
