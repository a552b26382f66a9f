"""DeepSpeed engine checkpoint without ZeRO (stage 0), 2 ranks on CPU, by the real ``save_checkpoint``:
one ``mp_rank_00_model_states.pt`` holding model and optimizer, then ``latest``."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import deepspeed_case


def build(tmp: Path) -> LayoutCase:
    return deepspeed_case(0, tmp)
