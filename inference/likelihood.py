"""Scoring held-out text: the summed negative log-likelihood of each text's tokens under the model.

Texts come in the same left-padded batches as prompts. Positions are counted from each row's first real
token, so a padded row scores exactly as it would alone; the first token of a text has nothing before it
and is not scored (with a BOS token, the first word is scored given BOS).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inference.metrics import DocumentRecord

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from inference.generation import Batch


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Per row, the negative log-likelihood (nats) of every token whose predecessor is a real token;
    shape ``[rows, length - 1]``, zero where nothing is scored."""
    import torch

    # Row by row: float32 log-probabilities of a whole batch (16 × 2048 × a 150k vocabulary) would not fit.
    picked = torch.stack(
        [
            torch.log_softmax(row[:-1].float(), dim=-1).gather(-1, ids[1:].unsqueeze(-1)).squeeze(-1)
            for row, ids in zip(logits, input_ids, strict=True)
        ]
    )
    scored = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    return torch.where(scored, -picked, torch.zeros_like(picked))


def score_batches(
    model: PreTrainedModel, batches: Sequence[Batch]
) -> tuple[dict[int, DocumentRecord], list[float]]:
    """Each text's :class:`DocumentRecord` by its index, and the seconds each batch took."""
    import torch

    device = next(iter(model.parameters())).device
    scores: dict[int, DocumentRecord] = {}
    latencies: list[float] = []
    # Causal LMs' forward takes position_ids; PreTrainedModel's annotations do not say so.
    forward: Any = model
    with torch.inference_mode():
        for batch in batches:
            started = time.perf_counter()
            ids = batch.input_ids.to(device)
            mask = batch.attention_mask.to(device)
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
            logits = forward(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).logits
            nll = token_nll(logits, ids, mask)
            counted = (mask[:, 1:].bool() & mask[:, :-1].bool()).sum(-1)
            latencies.append(time.perf_counter() - started)
            for row, index in enumerate(batch.indices):
                scores[index] = DocumentRecord(nll=float(nll[row].sum()), tokens=int(counted[row]))
    return scores, latencies


def scored_text(tokenizer: PreTrainedTokenizerBase, text: str, max_length: int) -> str:
    """The part of ``text`` whose tokens were scored: all of it, or what fits in ``max_length`` tokens."""
    if len(tokenizer(text)["input_ids"]) <= max_length:
        return text
    try:
        kept = tokenizer(text, truncation=True, max_length=max_length, return_offsets_mapping=True)
        return text[: max(end for _, end in kept["offset_mapping"])]
    except NotImplementedError:
        # A slow tokenizer has no offsets: the kept tokens decoded.
        ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
        return str(tokenizer.decode(ids, skip_special_tokens=True))


def with_text_units(
    documents: Sequence[DocumentRecord],
    texts: Sequence[str],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
) -> tuple[DocumentRecord, ...]:
    """Each document with the words and UTF-8 bytes of its scored text, counted as lm-eval counts them
    (``len(re.split(r"\\s+", text))``, ``len(text.encode())``), for word and byte perplexity."""
    counted = []
    for document, text in zip(documents, texts, strict=True):
        scored = scored_text(tokenizer, text, max_length)
        counted.append(
            dataclasses.replace(
                document, words=len(re.split(r"\s+", scored)), bytes=len(scored.encode("utf-8"))
            )
        )
    return tuple(counted)
