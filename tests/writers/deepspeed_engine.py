"""Train the toy model with the real DeepSpeed engine on CPU and save engine checkpoints, as a trainer does.

Run under torchrun (2 ranks, gloo)::

    DS_ACCELERATOR=cpu LOCAL_SIZE=2 torchrun --standalone --nproc-per-node 2 \
        tests/writers/deepspeed_engine.py --out OUT --stage 0 --stage 3 --steps 2

Each ``--stage S`` trains a fresh model (same seed) under its own engine into ``RUN = OUT/zeroS``, one
stage after the other in the same process group: one launch pays torch's and DeepSpeed's imports once
for every stage (three launches cost 40 s more CPU on 2 cores). Every step it calls
``engine.save_checkpoint(RUN)``: ``RUN/global_stepN/``, then ``RUN/latest``.
With ``--openrlhf`` a ZeRO-3 run is saved as OpenRLHF's PPO actor does (``openrlhf/trainer/ray/ppo_actor.py``,
``PolicyModelActor.save_checkpoint``, with ``--save_hf_ckpt``): the engine checkpoint into ``RUN/_actor``
(``strategy.save_ckpt`` calls ``engine.save_checkpoint(RUN/_actor, tag="global_stepN")``), then
``strategy.save_model`` (``openrlhf/utils/deepspeed/deepspeed.py``) into ``RUN/global_stepN_hf``: weights
gathered on every rank, then rank 0 runs ``save_pretrained``, rewrites ``config.json``, saves the tokenizer.

Rank 0 also writes what a test needs to check a consolidation against the trained model:
``RUN_reference/hf_config/`` (``config.json`` and the tokenizer, the folder a run's ``hf_config`` names) and
``RUN_reference/logits.safetensors`` (the engine's logits on fixed prompts after the last step).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

PROMPTS = ("12+34=", "7+5=")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), action="append", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--openrlhf", action="store_true", help="save the ZeRO-3 run as OpenRLHF does")
    args = parser.parse_args()

    # DeepSpeed's CPU shared-memory all-reduce needs LOCAL_SIZE; torchrun only sets LOCAL_WORLD_SIZE.
    os.environ.setdefault("LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))
    from inference.worker import skip_mlflow

    # A trainer here logs nowhere: without this, importing DeepSpeed imports mlflow (installed for the
    # tracker tests), seconds of CPU per rank.
    skip_mlflow()
    import torch

    torch.set_num_threads(1)
    for stage in args.stage:
        train_and_save(args.out / f"zero{stage}", stage, args.steps, openrlhf=args.openrlhf and stage == 3)


def train_and_save(out: Path, stage: int, steps: int, *, openrlhf: bool) -> None:
    import deepspeed
    import torch
    from safetensors.torch import save_file

    from inference.toy.problems import training_problems
    from inference.toy.tokenizer import build_tokenizer
    from inference.toy.trainer import build_model, encode_problems

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 1000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    rank = engine.global_rank
    input_ids, attention_mask, labels = encode_problems(tokenizer, training_problems()[:64])
    for step in range(steps):
        rows = slice((step * 2 + rank) * 4, (step * 2 + rank + 1) * 4)
        loss = engine(
            input_ids=input_ids[rows], attention_mask=attention_mask[rows], labels=labels[rows]
        ).loss
        engine.backward(loss)
        engine.step()
        tag = f"global_step{engine.global_steps}"
        if not openrlhf:
            engine.save_checkpoint(str(out))
            continue
        engine.save_checkpoint(str(out / "_actor"), tag=tag)
        # OpenRLHF's save_model: every rank joins the ZeRO-3 gather, rank 0 writes.
        gathered = engine._consolidated_16bit_state_dict()
        if rank == 0:
            folder = out / f"{tag}_hf"
            model.save_pretrained(folder, state_dict=gathered)
            model.config.to_json_file(folder / "config.json")
            tokenizer.save_pretrained(folder)
        deepspeed.comm.barrier()

    # Every rank runs the forward pass: under ZeRO-3 each holds only a slice of every weight.
    prompts = tokenizer(list(PROMPTS), return_tensors="pt", padding=True)
    engine.eval()
    with torch.no_grad():
        logits = engine(**prompts).logits
    if rank == 0:
        reference = Path(f"{out}_reference")
        model.config.save_pretrained(reference / "hf_config")
        model.generation_config.save_pretrained(reference / "hf_config")
        tokenizer.save_pretrained(reference / "hf_config")
        save_file({"logits": logits.contiguous()}, reference / "logits.safetensors")
    deepspeed.comm.barrier()
    # The next stage builds an engine of its own; this one's hooks and partitioned tensors go first.
    engine.destroy()


if __name__ == "__main__":
    main()
