"""``transformers.Trainer`` checkpoint (no DeepSpeed), written by the real Trainer on the toy model."""

from __future__ import annotations

from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.writers.launch import trainer_order, trainer_run


def build(tmp: Path) -> LayoutCase:
    run = trainer_run(tmp / "run")
    return LayoutCase(
        layout="hf_trainer",
        source=run,
        candidate="checkpoint-4",
        order=trainer_order(run, "checkpoint-4"),
        step=4,
    )
