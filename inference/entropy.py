"""The policy's entropy at each decoding step, measured inside ``generate`` as it samples.

A logits processor sees every step's logits without keeping them (a vocabulary of 150k by a thousand
steps by a batch would not fit). transformers runs custom processors before its temperature and top-p
warpers, so the scores seen here are the model's own; dividing by the temperature gives the distribution
the token is drawn from before top-p, which is the policy an RL trainer optimises.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers.generation.logits_process import LogitsProcessor


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy in nats of ``softmax(logits / temperature)`` over the last dimension."""
    log_p = torch.log_softmax(logits.float() / temperature, dim=-1)
    p = log_p.exp()
    # A token of probability 0 contributes 0, not 0 · -inf = NaN; NaN logits (a diverged model) stay NaN.
    return -torch.where(p == 0, torch.zeros_like(p), p * log_p).sum(dim=-1)


class EntropyMeter(LogitsProcessor):
    def __init__(self, temperature: float) -> None:
        # Greedy decoding has no temperature: its policy is the plain softmax.
        self._temperature = temperature if temperature > 0 else 1.0
        self._steps: list[torch.Tensor] = []

    # No **kwargs: transformers insists that a processor taking more than (input_ids, scores) gets them all.
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._steps.append(token_entropy(scores, self._temperature))
        return scores

    def per_row(self, lengths: Sequence[int]) -> list[tuple[float, int]]:
        """Each row's summed entropy over its first ``lengths[row]`` steps, and how many steps that was."""
        if not self._steps:
            return [(0.0, 0) for _ in lengths]
        table = torch.stack(self._steps, dim=1).cpu()
        totals = []
        for row, length in enumerate(lengths):
            steps = min(length, table.shape[1])
            totals.append((float(table[row, :steps].sum()), steps))
        return totals
