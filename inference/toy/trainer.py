"""Train a tiny Llama on toy addition and save Hugging Face checkpoints as it goes, like a real trainer.

The demo's stand-in for an RL trainer, run as its own process::

    python -m inference.toy.trainer --out RUN_DIR --steps 720 --save-every 120

Every ``--save-every`` steps (and at the last step) it writes ``RUN_DIR/step_N/`` with
``model.save_pretrained`` and then ``tokenizer.save_pretrained``, straight into the final directory as
Hugging Face does (no temporary name, no marker file): the evaluator has to tell a half-written
checkpoint from a finished one by itself. Each finished save prints one JSON line to stdout,
``{"event": "trainer.saved", "step": N, "path": "..."}``; everything else is logged to stderr.
Accuracy on held-out problems climbs from about 0 at the first checkpoint to most answers right at the last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from inference.toy.problems import Problem, training_problems
from inference.toy.tokenizer import build_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

log = structlog.get_logger("inference.toy.trainer")

#: Masked out of the loss (the prompt and the padding); PyTorch's cross-entropy ignore index.
IGNORE_INDEX = -100
LOG_EVERY = 100


@dataclass(frozen=True)
class TrainConfig:
    out: Path
    steps: int = 720
    save_every: int = 120
    seed: int = 0
    threads: int | None = 1
    max_shard_size: str | None = None
    sleep_between_saves: float = 0.0
    lr: float = 3e-3
    batch_size: int = 64
    warmup_steps: int = 50
    #: After this step the learning rate jumps to ``collapse_lr``: a run that goes wrong, for the demo's
    #: alerts. The schedule before it is the one a run of ``collapse_at`` steps would have.
    collapse_at: int | None = None
    collapse_lr: float = 0.05


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A 2-layer Llama of about 0.3 M parameters: big enough to learn two-digit addition in a minute."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    # Saved with the weights, so that a plain ``generate`` stops at </s> and pads with <pad>.
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def encode_problems(
    tokenizer: PreTrainedTokenizerFast, problems: Sequence[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask, labels)``; only the answer and ``</s>`` carry loss.

    The prompt is tokenised exactly as the evaluator tokenises it (with ``<s>`` in front), so training
    and evaluation see the same tokens.
    """
    import torch

    prompts = tokenizer([p.prompt for p in problems], add_special_tokens=True)["input_ids"]
    targets = tokenizer([p.target for p in problems], add_special_tokens=False)["input_ids"]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [(prompt, [*target, eos]) for prompt, target in zip(prompts, targets, strict=True)]
    width = max(len(prompt) + len(answer) for prompt, answer in rows)
    # Padded as lists and made tensors once: three tensor writes a row cost 1.5 CPU-s for the 9,000.
    ids, mask, labels = [], [], []
    for prompt, answer in rows:
        fill = width - len(prompt) - len(answer)
        ids.append([*prompt, *answer, *[pad] * fill])
        mask.append([1] * (len(prompt) + len(answer)) + [0] * fill)
        labels.append([IGNORE_INDEX] * len(prompt) + answer + [IGNORE_INDEX] * fill)
    return (
        torch.tensor(ids, dtype=torch.long),
        torch.tensor(mask, dtype=torch.long),
        torch.tensor(labels, dtype=torch.long),
    )


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth: the last checkpoint gets the settled weights."""
    if config.collapse_at is not None and step >= config.collapse_at:
        return config.collapse_lr
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    end = config.steps if config.collapse_at is None else min(config.steps, config.collapse_at)
    progress = (step - config.warmup_steps) / max(1, end - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def save_checkpoint(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, step: int, config: TrainConfig
) -> Path:
    path = config.out / f"step_{step}"
    if config.max_shard_size is None:
        model.save_pretrained(path)
    else:
        model.save_pretrained(path, max_shard_size=config.max_shard_size)
    tokenizer.save_pretrained(path)
    return path


def train(config: TrainConfig) -> list[Path]:
    """Train for ``config.steps`` steps, saving every ``config.save_every``; returns the checkpoints."""
    import torch

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    config.out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer()
    model = build_model(tokenizer)
    input_ids, attention_mask, labels = encode_problems(tokenizer, training_problems())
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=0.01)
    log.info("trainer.started", out=str(config.out), steps=config.steps, problems=len(input_ids))

    saved: list[Path] = []
    started = time.perf_counter()
    model.train()
    for step in range(1, config.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step - 1, config)
        rows = torch.randint(len(input_ids), (config.batch_size,), generator=generator)
        loss = model(input_ids=input_ids[rows], attention_mask=attention_mask[rows], labels=labels[rows]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % LOG_EVERY == 0:
            log.info("trainer.step", step=step, loss=round(loss.item(), 4))
        if step % config.save_every == 0 or step == config.steps:
            path = save_checkpoint(model, tokenizer, step, config)
            saved.append(path)
            print(json.dumps({"event": "trainer.saved", "step": step, "path": str(path)}), flush=True)
            if config.sleep_between_saves > 0 and step < config.steps:
                time.sleep(config.sleep_between_saves)
    log.info("trainer.finished", steps=config.steps, train_s=round(time.perf_counter() - started, 2))
    return saved


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _shard_size(text: str) -> str:
    from transformers.utils.hub import convert_file_size_to_int

    try:
        convert_file_size_to_int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 300KB or 5MB") from exc
    return text


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    defaults = TrainConfig(out=Path())
    parser = argparse.ArgumentParser(
        prog="python -m inference.toy.trainer",
        description="Train a tiny Llama on addition, saving Hugging Face checkpoints RUN_DIR/step_N.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="run directory (RUN_DIR)")
    parser.add_argument("--steps", type=_positive_int, default=defaults.steps, help="optimizer steps")
    parser.add_argument(
        "--save-every",
        type=_positive_int,
        default=defaults.save_every,
        help="save every N steps and at the end",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="initialisation and batch order")
    parser.add_argument("--threads", type=_positive_int, default=defaults.threads, help="torch threads")
    parser.add_argument(
        "--max-shard-size", type=_shard_size, help="shard the weights (e.g. 300KB) with an index file"
    )
    parser.add_argument(
        "--sleep-between-saves", type=float, default=0.0, metavar="SECS", help="pause after each save"
    )
    parser.add_argument("--lr", type=float, default=defaults.lr, help="peak learning rate")
    parser.add_argument(
        "--batch-size", type=_positive_int, default=defaults.batch_size, help="problems per step"
    )
    parser.add_argument(
        "--collapse-at",
        type=_positive_int,
        metavar="STEP",
        help="after STEP, jump to --collapse-lr (a run gone wrong)",
    )
    parser.add_argument(
        "--collapse-lr", type=float, default=defaults.collapse_lr, help="the learning rate then"
    )
    args = parser.parse_args(argv)
    if args.sleep_between_saves < 0:
        parser.error("--sleep-between-saves must not be negative")
    if args.lr <= 0:
        parser.error("--lr must be positive")
    return TrainConfig(
        out=args.out,
        steps=args.steps,
        save_every=args.save_every,
        seed=args.seed,
        threads=args.threads,
        max_shard_size=args.max_shard_size,
        sleep_between_saves=args.sleep_between_saves,
        lr=args.lr,
        batch_size=args.batch_size,
        warmup_steps=min(
            defaults.warmup_steps, max(1, min(args.steps, args.collapse_at or args.steps) // 10)
        ),
        collapse_at=args.collapse_at,
        collapse_lr=args.collapse_lr,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    from inference.worker import configure_logging, quiet_libraries

    quiet_libraries()
    configure_logging()
    train(config)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every checkpoint is saved and closed; the interpreter's teardown of torch and transformers would
    # cost about a second of CPU for nothing.
    os._exit(code)
