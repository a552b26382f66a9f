"""DeepSpeed engine checkpoint, ZeRO-2, 2 ranks on CPU, written by the real ``engine.save_checkpoint``."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import deepspeed_order, deepspeed_run


def build(tmp: Path) -> LayoutCase:
    run = deepspeed_run(2, tmp / "run")
    return LayoutCase(
        layout="deepspeed",
        source=run,
        candidate="global_step2",
        order=deepspeed_order(run, "global_step2"),
        step=2,
        hf_config=tmp / "run_reference" / "hf_config",
    )
