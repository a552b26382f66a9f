"""save_pretrained, sharded: config first, then the shards, the index last, then the tokenizer
(transformers' ``PreTrainedModel.save_pretrained`` followed by the tokenizer's, as the HF Trainer and
AReaL save)."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase, write_order


def build(tmp: Path) -> LayoutCase:
    from inference.toy.tokenizer import build_tokenizer
    from inference.toy.trainer import build_model

    source = tmp / "run"
    folder = source / "step_40"
    tokenizer = build_tokenizer()
    build_model(tokenizer).save_pretrained(folder, max_shard_size="400KB")
    model_files = write_order(folder)
    tokenizer.save_pretrained(folder)
    tokenizer_files = [p for p in sorted(folder.iterdir()) if p not in model_files]
    order = tuple(str(p.relative_to(source)) for p in [*model_files, *tokenizer_files])
    return LayoutCase(layout="hf", source=source, candidate="step_40", order=order, step=40)
