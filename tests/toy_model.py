"""The tiny toy model and tokenizer the trainer layout cases save."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast


def toy_model(seed: int = 0) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    import torch

    from inference.toy.tokenizer import build_tokenizer
    from inference.toy.trainer import build_model

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    return build_model(tokenizer), tokenizer
