"""Batched generation with a Hugging Face causal LM (plain or sharded by DeepSpeed AutoTP).

Prompts are sorted by token length and cut into batches, so each batch pads as little as possible;
batches are left-padded (generation appends on the right) and decode with the KV cache. A batch is
prepared once (:func:`prepare_batches`, on the tp head) and can be sent as is to the other tp ranks.
Sampling draws each sample's tokens from a seed of its own (the job's seed, the item, the sample's index:
:mod:`inference.engines.draws`), so it draws the same tokens on every tp rank, in every run and in
whatever batch the item lands.

The engines that run the batches live in :mod:`inference.engines` (``fixed``: these left-padded batches
through ``generate``; ``continuous``: sequences refilled into free slots as others end); this module
holds what they share.

A response ends at an EOS token or at the first stop string; ``tokens`` counts what was generated up to
there (the stop string included, padding and EOS not), and a response that used all ``max_new_tokens``
without ending is ``truncated``. With ``n_samples`` > 1 each prompt gets that many completions, in the
prompt's order (prompt-major).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inference.engines.base import (
    Agreement,
    Decoding,
    End,
    EndAgreement,
    Generation,
    finish,
    stop_token_ids,
)
from inference.engines.batches import Batch, Encoding, length_buckets, prepare_batches, token_lengths

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class GenerationRun:
    #: ``n_samples`` per prompt, prompt-major, in the prompts' order.
    generations: tuple[Generation, ...]
    #: Seconds each batch took, in the order the batches ran (shortest prompts first).
    batch_latencies_s: tuple[float, ...]

    @property
    def generation_s(self) -> float:
        return sum(self.batch_latencies_s)

    @property
    def tokens(self) -> int:
        return sum(g.tokens for g in self.generations)


def run_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batches: Sequence[Batch],
    decoding: Decoding,
    *,
    item_keys: Sequence[int] | None = None,
    agree: Agreement | None = None,
    agree_ends: EndAgreement | None = None,
) -> tuple[dict[int, list[Generation]], list[float]]:
    """The fixed-batch engine over prepared ``batches`` (:func:`inference.engines.fixed.run_batches`)."""
    from inference.engines.fixed import run_batches as run_fixed

    return run_fixed(
        model, tokenizer, batches, decoding, item_keys=item_keys, agree=agree, agree_ends=agree_ends
    )


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    decoding: Decoding,
    *,
    batch_size: int,
    engine: str = "fixed",
) -> GenerationRun:
    """Completions of ``prompts`` in one process, by the named engine (:data:`inference.engines.ENGINES`)."""
    from inference.engines import build_engine, requests_of

    batches = prepare_batches(tokenizer, prompts, batch_size)
    run = build_engine(engine, model, tokenizer, batch_size=batch_size).run(requests_of(batches), decoding)
    return GenerationRun(
        generations=tuple(g for i in range(len(prompts)) for g in run.generations[i]),
        batch_latencies_s=tuple(run.latencies),
    )


__all__ = [
    "Agreement",
    "Batch",
    "Decoding",
    "Encoding",
    "End",
    "EndAgreement",
    "Generation",
    "GenerationRun",
    "finish",
    "generate",
    "length_buckets",
    "prepare_batches",
    "run_batches",
    "stop_token_ids",
    "token_lengths",
]
