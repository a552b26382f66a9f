"""Policy entropy over the generated tokens: its collapse is the classic sign of an RL run that has
stopped exploring."""

from __future__ import annotations

from typing import ClassVar

from inference.metrics.base import EvalRecord, Metric, ratio_with_stderr
from inference.spec import MetricValue


class Entropy(Metric):
    """Token-weighted, as RL trainers log it: total entropy over total decoding steps, each response's end
    token included; the standard error treats responses, not tokens, as the independent draws.

    A step's entropy is that of the distribution the token was drawn from before top-p: the logits divided
    by the temperature (by 1 when decoding greedily)."""

    name = "entropy"
    higher_is_better: ClassVar[bool | None] = None
    description: ClassVar[str] = "mean entropy (nats) of the policy per generated token"

    def compute(self, record: EvalRecord) -> MetricValue:
        scored = [sample for sample in record.samples if sample.entropy_tokens > 0]
        return ratio_with_stderr(
            self.name, [s.entropy_sum for s in scored], [float(s.entropy_tokens) for s in scored]
        )
