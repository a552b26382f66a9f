"""Policy entropy over the generated tokens: its collapse is the classic sign of an RL run that has
stopped exploring."""

from __future__ import annotations

from typing import ClassVar

from inference.metrics.base import EvalRecord, Metric, ratio_with_stderr
from inference.spec import MetricValue


class Entropy(Metric):
    """Token-weighted, as RL trainers log it: total entropy over total decoding steps, each response's end
    token included; the standard error treats prompts, not tokens, as the independent draws; ``n`` is the
    prompts.

    A step's entropy is that of the distribution the token was drawn from before top-p: the logits divided
    by the temperature (by 1 when decoding greedily)."""

    name = "entropy"
    higher_is_better: ClassVar[bool | None] = None
    description: ClassVar[str] = "mean entropy (nats) of the policy per generated token"

    def compute(self, record: EvalRecord) -> MetricValue:
        # A prompt's completions are one draw (see SampleMetric): they are summed into one unit.
        sums: dict[int, float] = {}
        steps: dict[int, int] = {}
        for sample in record.samples:
            if sample.entropy_tokens > 0:
                sums[sample.group] = sums.get(sample.group, 0.0) + sample.entropy_sum
                steps[sample.group] = steps.get(sample.group, 0) + sample.entropy_tokens
        groups = sorted(sums)
        return ratio_with_stderr(self.name, [sums[g] for g in groups], [float(steps[g]) for g in groups])
