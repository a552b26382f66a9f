"""The next token of each row: greedy, or drawn with a seed of the row's own, whatever batch it is in.

A sampled row draws its token at step ``s`` by the inverse of the policy's cumulative distribution at a
uniform number fixed by a hash of (the job's seed, the item, the sample's index, ``s``): the same item
and sample draw the same tokens alone, in any batch, on any engine and on every tp rank, where one
generator shared by a batch would hand each row whatever its neighbours left. The policy is exactly the
configured one: ``softmax(logits / temperature)`` cut to its top-p nucleus (the smallest set of most
likely tokens holding ``top_p`` of the mass, as transformers' ``TopPLogitsWarper`` keeps it), nothing else.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from transformers.generation.logits_process import LogitsProcessor

_MASK32 = 0xFFFF_FFFF


def sample_seed(seed: int, item: int, sample: int) -> int:
    """The seed of one sample of one item: fixed by the job's seed, the item's position in the eval set
    and the sample's index, whatever else runs beside it."""
    digest = hashlib.sha256(repr((seed, item, sample)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    # A 32-bit integer hash (Wellons' "lowbias32" shape) in int64 arithmetic: both multipliers are below
    # 2**31, so no product of a 32-bit value overflows int64 on any device.
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _MASK32
    return x ^ (x >> 15)


def uniforms(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One number in (0, 1) per row, fixed by the row's seed (int64) and its step; float64."""
    low, high = seeds & _MASK32, (seeds >> 32) & _MASK32
    x = _mix32(_mix32(low ^ _mix32(high)) ^ (steps & _MASK32))
    return (x.double() + 0.5) / 2.0**32


def choose(
    logits: torch.Tensor, temperature: float, top_p: float, seeds: torch.Tensor, steps: torch.Tensor
) -> torch.Tensor:
    """Each row's next token: the argmax when ``temperature`` is 0, else a draw from the policy at the
    row's own uniform number."""
    if temperature <= 0:
        return torch.argmax(logits, dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    cumulative = ordered.cumsum(dim=-1)
    if top_p < 1.0:
        # A token stays while the mass of the tokens more likely than it is below top_p (the top one always).
        before = cumulative - ordered
        ordered = torch.where(before < top_p, ordered, torch.zeros_like(ordered))
        cumulative = ordered.cumsum(dim=-1)
    target = uniforms(seeds.to(logits.device), steps.to(logits.device)) * cumulative[:, -1].double()
    rank = torch.searchsorted(cumulative.double(), target.unsqueeze(-1), right=True).squeeze(-1)
    # Float rounding can put the target a hair past the last kept token's cumulative mass.
    kept = (ordered > 0).sum(dim=-1)
    rank = torch.minimum(rank, kept - 1)
    return order.gather(-1, rank.unsqueeze(-1)).squeeze(-1)


class SeededDraw(LogitsProcessor):
    """:func:`choose` inside transformers' ``generate`` (which then decodes greedily): every score but the
    chosen token's is set to -inf. Rows are the prompts' samples, prompt-major, as ``generate`` lays out
    ``num_return_sequences``."""

    def __init__(self, *, prompt_length: int, seeds: Sequence[int], temperature: float, top_p: float) -> None:
        self._prompt_length = prompt_length
        self._seeds = torch.tensor(list(seeds), dtype=torch.int64)
        self._temperature = temperature
        self._top_p = top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self._prompt_length
        steps = torch.full_like(self._seeds, step)
        tokens = choose(scores, self._temperature, self._top_p, self._seeds, steps)
        chosen = torch.full_like(scores, float("-inf"))
        chosen.scatter_(-1, tokens.unsqueeze(-1), 0.0)
        return chosen  # type: ignore[return-value]
