"""OpenRLHF actor checkpoint ``_actor/global_step2`` (ZeRO-3, 2 ranks), saved by the real DeepSpeed engine
the way ``openrlhf/trainer/ray/ppo_actor.py`` (``PolicyModelActor.save_checkpoint``) calls it."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import deepspeed_order, deepspeed_run


def build(tmp: Path) -> LayoutCase:
    run = deepspeed_run(3, tmp / "ckpt")
    actor = deepspeed_order(run / "_actor", "global_step2")
    return LayoutCase(
        layout="openrlhf",
        source=run,
        candidate="_actor/global_step2",
        order=tuple(f"_actor/{relpath}" for relpath in actor),
        step=2,
        hf_config=tmp / "ckpt_reference" / "hf_config",
    )
