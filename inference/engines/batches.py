"""Prompts as left-padded batches of similar length, prepared once (on the tp head) and sent as they are
to the other tp ranks, so every rank computes on the same tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class Batch:
    #: Positions of the batch's prompts in the caller's prompt list.
    indices: tuple[int, ...]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches of similar length (stable for equal lengths)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


@dataclass(frozen=True)
class Encoding:
    """How prompts become tokens: a chat template adds its own special tokens; scored text may be cut."""

    add_special_tokens: bool = True
    max_length: int | None = None

    def kwargs(self) -> dict[str, Any]:
        cut = {"truncation": True, "max_length": self.max_length} if self.max_length is not None else {}
        return {"add_special_tokens": self.add_special_tokens, **cut}


def token_lengths(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], encoding: Encoding = Encoding()
) -> list[int]:
    return [len(ids) for ids in tokenizer(list(prompts), **encoding.kwargs())["input_ids"]]


def prepare_batches(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    batch_size: int,
    encoding: Encoding = Encoding(),
) -> list[Batch]:
    """Left-padded batches of ``prompts``, bucketed by token length; the tokenizer must pad on the left."""
    batches = []
    for bucket in length_buckets(token_lengths(tokenizer, prompts, encoding), batch_size):
        encoded = tokenizer(
            [prompts[i] for i in bucket], return_tensors="pt", padding=True, **encoding.kwargs()
        )
        batches.append(Batch(tuple(bucket), encoded["input_ids"], encoded["attention_mask"]))
    return batches
