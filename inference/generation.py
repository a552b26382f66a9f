"""Batched greedy generation with a Hugging Face causal LM.

Prompts are sorted by token length and cut into batches, so each batch pads as little as possible;
batches are left-padded (generation appends on the right) and decode with the KV cache. Results come
back in the prompts' order.

Token counts exclude padding and the closing EOS: ``tokens`` is the length of the answer itself, and a
response that hit ``max_new_tokens`` without an EOS is ``truncated``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class Generation:
    #: The response, special tokens stripped.
    text: str
    #: Generated tokens before EOS (padding and EOS not counted).
    tokens: int
    #: ``max_new_tokens`` ran out before an EOS.
    truncated: bool


@dataclass(frozen=True)
class GenerationRun:
    #: One per prompt, in the prompts' order.
    generations: tuple[Generation, ...]
    #: Seconds each batch took, in the order the batches ran (shortest prompts first).
    batch_latencies_s: tuple[float, ...]

    @property
    def generation_s(self) -> float:
        return sum(self.batch_latencies_s)

    @property
    def tokens(self) -> int:
        return sum(g.tokens for g in self.generations)


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches of similar length (stable for equal lengths)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    configured: Any = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    return sorted(i for i in ids if isinstance(i, int))


def _until_stop(row: list[int], stop_ids: set[int]) -> tuple[list[int], bool]:
    """The answer's tokens, and whether no stop token came (then the row ran to ``max_new_tokens``)."""
    for position, token in enumerate(row):
        if token in stop_ids:
            return row[:position], False
    return row, True


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    batch_size: int,
) -> GenerationRun:
    """Greedy completions of ``prompts``; the tokenizer must pad on the left and have a pad token."""
    import torch

    device = model.device
    stop_ids = _stop_ids(model, tokenizer)
    stop_set = set(stop_ids)
    pad_id = tokenizer.pad_token_id
    lengths = [len(ids) for ids in tokenizer(list(prompts), add_special_tokens=True)["input_ids"]]
    results: dict[int, Generation] = {}
    latencies: list[float] = []
    with torch.inference_mode():
        for batch in length_buckets(lengths, batch_size):
            encoded = tokenizer(
                [prompts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=True
            ).to(device)
            started = time.perf_counter()
            # Causal LMs mix in GenerationMixin, which PreTrainedModel's annotations do not show; without
            # return_dict_in_generate the result is the token tensor.
            generator: Any = model
            output: torch.Tensor = generator.generate(
                **encoded,
                do_sample=False,
                use_cache=True,
                max_new_tokens=max_new_tokens,
                eos_token_id=stop_ids,
                pad_token_id=pad_id,
            )
            latencies.append(time.perf_counter() - started)
            # A row that stopped early is padded after its stop token, which is cut here too.
            answers = [
                _until_stop(row, stop_set) for row in output[:, encoded["input_ids"].shape[1] :].tolist()
            ]
            texts = tokenizer.batch_decode([tokens for tokens, _ in answers], skip_special_tokens=True)
            for index, text, (tokens, truncated) in zip(batch, texts, answers, strict=True):
                results[index] = Generation(text=text, tokens=len(tokens), truncated=truncated)
    return GenerationRun(
        generations=tuple(results[i] for i in range(len(prompts))),
        batch_latencies_s=tuple(latencies),
    )
