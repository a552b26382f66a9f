"""An AReaL ``save_pretrained`` checkpoint, named and written as AReaL does.

Folder: ``areal/utils/saver.py`` ``Saver.get_save_checkpoint_path`` —
``checkpoints/{user}/{experiment}/{trial}/{name}/epoch{E}epochstep{S}globalstep{G}``.
Files, in order: ``areal/engine/fsdp_engine.py`` ``_save_model_to_hf`` — ``model.save_pretrained``
(``config.json``, ``generation_config.json``, ``model.safetensors``), ``model_config.save_pretrained``
(``config.json`` rewritten), ``tokenizer.save_pretrained`` (``tokenizer_config.json``, ``tokenizer.json``).
"""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.toy_model import toy_model

#: The run root a user points evald at: AReaL's per-trial, per-model folder.
ROOT = "checkpoints/evald/toy/trial0/default"
CANDIDATE = "epoch1epochstep3globalstep11"


def build(tmp: Path) -> LayoutCase:
    model, tokenizer = toy_model(seed=11)
    root = tmp / ROOT
    folder = root / CANDIDATE
    model.save_pretrained(folder)
    model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    order = tuple(
        f"{CANDIDATE}/{name}"
        for name in (
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer_config.json",
            "tokenizer.json",
        )
    )
    return LayoutCase(layout="areal", source=root, candidate=CANDIDATE, order=order, step=11, epoch=1)
