"""DeepSpeed engine checkpoint, ZeRO-1, 2 ranks on CPU, written by the real ``engine.save_checkpoint``."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import deepspeed_case


def build(tmp: Path) -> LayoutCase:
    return deepspeed_case(1, tmp)
