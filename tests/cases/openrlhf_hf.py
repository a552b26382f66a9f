"""OpenRLHF ``--save_hf_ckpt`` folder ``global_step2_hf``, written as ``strategy.save_model`` writes it.

Order from ``openrlhf/utils/deepspeed/deepspeed.py`` (``save_model``): ``save_pretrained`` (config,
generation config, weights), ``config.json`` written again, then the tokenizer (its config, then
``tokenizer.json``). A case lists each file once; the rewrite of ``config.json`` is tested on its own.
"""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import deepspeed_run

ORDER = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer_config.json",
    "tokenizer.json",
)


def build(tmp: Path) -> LayoutCase:
    run = deepspeed_run(3, tmp / "ckpt")
    return LayoutCase(
        layout="openrlhf",
        source=run,
        candidate="global_step2_hf",
        order=tuple(f"global_step2_hf/{name}" for name in ORDER),
        step=2,
    )
