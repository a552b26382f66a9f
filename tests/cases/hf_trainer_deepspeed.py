"""``transformers.Trainer`` under DeepSpeed ZeRO-3 (2 ranks, CPU): weights only in ``global_stepN/``."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import trainer_order, trainer_run


def build(tmp: Path) -> LayoutCase:
    run = trainer_run(tmp / "run", zero_stage=3)
    return LayoutCase(
        layout="hf_trainer",
        source=run,
        candidate="checkpoint-4",
        order=trainer_order(run, "checkpoint-4"),
        step=4,
    )
