"""``save_pretrained`` with ``pytorch_model-0000x-of-0000y.bin`` shards and their index (no safetensors).

transformers 5 no longer writes ``.bin`` weights, so the shards are written the way transformers 4 did
with ``safe_serialization=False``: ``torch.save`` of each shard's state dict, then
``pytorch_model.bin.index.json`` last. The tokenizer is saved first here (``tokenizer.save_pretrained``
before ``model.save_pretrained``), so the index really is the last write.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.toy_model import toy_model

CANDIDATE = "checkpoint_bin_5"
SHARDS = ("pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin")


def build(tmp: Path) -> LayoutCase:
    import torch

    model, tokenizer = toy_model(seed=5)
    folder = tmp / "run" / CANDIDATE
    folder.mkdir(parents=True)
    tokenizer.save_pretrained(folder)
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    state = model.state_dict()
    names = list(state)
    halves = (names[: len(names) // 2], names[len(names) // 2 :])
    weight_map = {}
    for shard, keys in zip(SHARDS, halves, strict=True):
        torch.save({k: state[k] for k in keys}, folder / shard)
        weight_map.update(dict.fromkeys(keys, shard))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())}}
    index["weight_map"] = weight_map
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
    order = [
        f"{CANDIDATE}/{name}"
        for name in ("tokenizer_config.json", "tokenizer.json", "config.json", "generation_config.json")
    ]
    order += [f"{CANDIDATE}/{shard}" for shard in SHARDS]
    order.append(f"{CANDIDATE}/pytorch_model.bin.index.json")
    return LayoutCase(layout="hf", source=tmp / "run", candidate=CANDIDATE, order=tuple(order), step=5)
