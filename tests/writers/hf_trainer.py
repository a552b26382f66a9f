"""Train the toy model with the real ``transformers.Trainer`` and let it save ``checkpoint-N/`` folders.

Plain (one process)::

    python tests/writers/hf_trainer.py --out RUN --steps 4 --save-steps 2

With DeepSpeed (2 ranks, gloo, CPU), where the Trainer hands the save to ``engine.save_checkpoint``::

    DS_ACCELERATOR=cpu LOCAL_SIZE=2 torchrun --standalone --nproc-per-node 2 \
        tests/writers/hf_trainer.py --out RUN --steps 4 --save-steps 2 --zero-stage 3

Rank 0 also writes ``RUN_reference/logits.safetensors``: the trained model's logits on fixed prompts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

PROMPTS = ("12+34=", "7+5=")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=2)
    parser.add_argument("--zero-stage", type=int, choices=(1, 2, 3))
    args = parser.parse_args()

    if "LOCAL_WORLD_SIZE" in os.environ:
        # DeepSpeed's CPU shared-memory all-reduce needs LOCAL_SIZE; torchrun only sets LOCAL_WORLD_SIZE.
        os.environ.setdefault("LOCAL_SIZE", os.environ["LOCAL_WORLD_SIZE"])
    from inference.worker import skip_mlflow

    # A trainer here logs nowhere: without this, importing DeepSpeed imports mlflow (installed for the
    # tracker tests), seconds of CPU per rank.
    skip_mlflow()
    import torch
    from safetensors.torch import save_file
    from transformers import Trainer, TrainingArguments

    from inference.toy.problems import training_problems
    from inference.toy.tokenizer import build_tokenizer
    from inference.toy.trainer import build_model, encode_problems

    torch.set_num_threads(1)
    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    input_ids, attention_mask, labels = encode_problems(tokenizer, training_problems()[:64])
    rows = [
        {"input_ids": i, "attention_mask": a, "labels": lab}
        for i, a, lab in zip(input_ids, attention_mask, labels, strict=True)
    ]
    deepspeed: dict[str, Any] | None = None
    if args.zero_stage is not None:
        deepspeed = {
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}},
            "zero_optimization": {"stage": args.zero_stage},
        }
    training = TrainingArguments(
        output_dir=str(args.out),
        max_steps=args.steps,
        save_steps=args.save_steps,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        use_cpu=args.zero_stage is None,
        report_to=[],
        logging_steps=1000,
        dataloader_num_workers=0,
        deepspeed=deepspeed,
        seed=0,
    )
    trainer = Trainer(model=model, args=training, train_dataset=rows, processing_class=tokenizer)
    trainer.train()

    prompts = tokenizer(list(PROMPTS), return_tensors="pt", padding=True)
    # Under ZeRO-3 only the engine gathers each rank's slice of the weights for a forward pass.
    network = trainer.model_wrapped if args.zero_stage == 3 else trainer.model
    if network is None:
        raise RuntimeError("the Trainer holds no model after training")
    network.eval()
    with torch.no_grad():
        logits = network(**prompts).logits
    if trainer.is_world_process_zero():
        reference = Path(f"{args.out}_reference")
        reference.mkdir(parents=True, exist_ok=True)
        save_file({"logits": logits.contiguous()}, str(reference / "logits.safetensors"))


if __name__ == "__main__":
    main()
