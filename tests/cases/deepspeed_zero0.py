"""DeepSpeed engine checkpoint without ZeRO (stage 0), 2 ranks on CPU, by the real ``save_checkpoint``:
one ``mp_rank_00_model_states.pt`` holding model and optimizer, then ``latest``."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import deepspeed_order, deepspeed_run


def build(tmp: Path) -> LayoutCase:
    run = deepspeed_run(0, tmp / "run")
    return LayoutCase(
        layout="deepspeed",
        source=run,
        candidate="global_step2",
        order=deepspeed_order(run, "global_step2"),
        step=2,
        hf_config=tmp / "run_reference" / "hf_config",
    )
