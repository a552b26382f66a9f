"""A verl FSDP checkpoint (two ranks), named and written as verl does.

Followed: ``verl/utils/checkpoint/fsdp_checkpoint_manager.py`` ``FSDPCheckpointManager.save_checkpoint``
(per-rank ``model_/optim_/extra_state_world_size_{W}_rank_{r}.pt``, then on rank 0 ``huggingface/``
config and tokenizer and ``fsdp_config.json``, then the full model into ``huggingface/`` when
``checkpoint.save_contents`` includes ``hf_model``) and ``verl/trainer/ppo/ray_trainer.py``
``_save_checkpoint`` (``data.pt``, then ``latest_checkpointed_iteration.txt`` in the run root, last).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.checkpoints import LayoutCase
from tests.toy_model import toy_model

STEP = 2
CANDIDATE = f"global_step_{STEP}"
WORLD = 2


def write(tmp: Path, *, hf_model: bool) -> LayoutCase:
    import torch

    model, tokenizer = toy_model(seed=2)
    root = tmp / "run"
    actor = root / CANDIDATE / "actor"
    actor.mkdir(parents=True)
    state = model.state_dict()
    names = list(state)
    order: list[str] = []
    for rank in range(WORLD):
        shard = {k: state[k].clone() for k in names[rank::WORLD]}
        for kind, payload in (
            ("model", shard),
            ("optim", {"state": {}, "param_groups": [{"lr": 1e-6, "params": []}]}),
            ("extra_state", {"lr_scheduler": None, "rng": {"cpu": torch.get_rng_state()}}),
        ):
            name = f"{kind}_world_size_{WORLD}_rank_{rank}.pt"
            torch.save(payload, actor / name)
            order.append(f"{CANDIDATE}/actor/{name}")
    huggingface = actor / "huggingface"
    model.config.save_pretrained(huggingface)
    tokenizer.save_pretrained(huggingface)
    order += [
        f"{CANDIDATE}/actor/huggingface/{n}"
        for n in ("config.json", "tokenizer_config.json", "tokenizer.json")
    ]
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": WORLD}, indent=4))
    order.append(f"{CANDIDATE}/actor/fsdp_config.json")
    if hf_model:
        model.save_pretrained(huggingface)
        order += [
            f"{CANDIDATE}/actor/huggingface/{n}" for n in ("generation_config.json", "model.safetensors")
        ]
    torch.save({"dataloader": {"epoch": 0, "index": 4}}, root / CANDIDATE / "data.pt")
    order.append(f"{CANDIDATE}/data.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(STEP))
    order.append("latest_checkpointed_iteration.txt")
    return LayoutCase(layout="verl", source=root, candidate=CANDIDATE, order=tuple(order), step=STEP)


def build(tmp: Path) -> LayoutCase:
    return write(tmp, hf_model=True)


def build_config_only(tmp: Path) -> LayoutCase:
    """verl's default ``save_contents`` (no ``hf_model``): ``huggingface/`` holds no weights."""
    return write(tmp, hf_model=False)
