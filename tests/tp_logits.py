"""Run under torchrun with 2 ranks: ``python -m tests.tp_logits CHECKPOINT OUT.json``.

Loads the checkpoint sharded (DeepSpeed AutoTP, tp=2, meta-device build) and whole (transformers), and
rank 0 writes the largest logit difference on a few prompts and the shapes of the sharded projections.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from inference.group import WorkerGroup
from inference.loader import load_model
from inference.spec import InferenceSpec

PROMPTS = ["<s>12+34=", "<s>7+8=", "<s>99+1="]


def main() -> None:
    checkpoint, out = Path(sys.argv[1]), Path(sys.argv[2])
    spec = InferenceSpec(tp=2, threads=1)
    group = WorkerGroup.start(spec)
    scratch = out.parent / f"scratch-{group.topology.rank}"
    sharded = load_model(checkpoint, spec, tp_group=group.tp_group, scratch=scratch)
    whole = load_model(checkpoint, InferenceSpec(engine="hf", threads=1), scratch=scratch)
    encoded = whole.tokenizer(PROMPTS, return_tensors="pt", padding=True)
    sharded_model: torch.nn.Module = sharded.model
    whole_model: torch.nn.Module = whole.model
    with torch.inference_mode():
        difference = (sharded_model(**encoded).logits - whole_model(**encoded).logits).abs().max().item()
    shapes = {n: list(p.shape) for n, p in sharded_model.named_parameters() if n.endswith("q_proj.weight")}
    full = next(list(p.shape) for n, p in whole_model.named_parameters() if n.endswith("q_proj.weight"))
    if group.topology.rank == 0:
        out.write_text(json.dumps({"max_abs_diff": difference, "q_proj": shapes, "full_q_proj": full}))
    group.close()


if __name__ == "__main__":
    main()
