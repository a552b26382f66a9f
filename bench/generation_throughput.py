"""Generation throughput: evald's pipeline against two plain-transformers baselines, in one process.

The model is a 4-layer Llama (3.2 M parameters, the toy tokenizer, random weights from a fixed
seed) on the CPU; the prompts are ``--prompts`` strings whose lengths spread like a real eval set's
(log-normal, 8 to 200 characters). All three decode greedily with the KV cache, ``--max-new-tokens`` at
most, and count the tokens each produced before EOS:

- ``evald``: ``inference.generation.generate`` (prompts bucketed by length, left-padded batches);
- ``per_prompt``: one ``model.generate`` call per prompt, as a naive evaluation loop does;
- ``batched``: ``model.generate`` on left-padded batches of ``--batch-size`` in the dataset's order
  (no bucketing), as a plain batched loop does.

They run alternating, ``--repeats`` times; medians are reported, with the ratios of evald's tokens/s to
each baseline's.

    python -m bench.generation_throughput [--prompts 256] [--batch-size 16] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

DIGITS = "0123456789+-*="


def make_prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    lengths = [min(200, max(8, int(rng.lognormvariate(3.3, 0.7)))) for _ in range(count)]
    return ["".join(rng.choice(DIGITS) for _ in range(n)) for n in lengths]


def build(seed: int) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from inference.toy.tokenizer import build_tokenizer

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    tokenizer.padding_side = "left"
    tokenizer.model_max_length = 512
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model: Any = LlamaForCausalLM(config)
    model.eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _answer_tokens(rows: Any, eos: int) -> int:
    total = 0
    for row in rows.tolist():
        total += row.index(eos) if eos in row else len(row)
    return total


def run_evald(model: Any, tokenizer: Any, prompts: Sequence[str], batch: int, new: int) -> int:
    from inference.generation import Decoding, generate

    return generate(model, tokenizer, prompts, Decoding(max_new_tokens=new), batch_size=batch).tokens


def run_per_prompt(model: Any, tokenizer: Any, prompts: Sequence[str], batch: int, new: int) -> int:
    import torch

    tokens = 0
    with torch.inference_mode():
        for prompt in prompts:
            encoded = tokenizer([prompt], return_tensors="pt")
            out = model.generate(**encoded, do_sample=False, max_new_tokens=new)
            tokens += _answer_tokens(out[:, encoded["input_ids"].shape[1] :], tokenizer.eos_token_id)
    return tokens


def run_batched(model: Any, tokenizer: Any, prompts: Sequence[str], batch: int, new: int) -> int:
    import torch

    tokens = 0
    with torch.inference_mode():
        for start in range(0, len(prompts), batch):
            encoded = tokenizer(list(prompts[start : start + batch]), return_tensors="pt", padding=True)
            out = model.generate(**encoded, do_sample=False, max_new_tokens=new)
            tokens += _answer_tokens(out[:, encoded["input_ids"].shape[1] :], tokenizer.eos_token_id)
    return tokens


Runner = Callable[[Any, Any, Sequence[str], int, int], int]
METHODS: dict[str, Runner] = {"evald": run_evald, "per_prompt": run_per_prompt, "batched": run_batched}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    model, tokenizer = build(args.seed)
    prompts = make_prompts(args.prompts, args.seed)
    rates: dict[str, list[float]] = {name: [] for name in METHODS}
    counts: dict[str, int] = {}
    run_evald(model, tokenizer, prompts[: args.batch_size], args.batch_size, 4)  # warm-up
    for _ in range(args.repeats):
        for name, method in METHODS.items():
            started = time.perf_counter()
            counts[name] = method(model, tokenizer, prompts, args.batch_size, args.max_new_tokens)
            rates[name].append(counts[name] / (time.perf_counter() - started))
    lengths = sorted(len(p) for p in prompts)
    print(
        f"{args.prompts} prompts ({lengths[0]}-{lengths[-1]} chars, median {lengths[len(lengths) // 2]}), "
        f"batch {args.batch_size}, max_new_tokens {args.max_new_tokens}, {args.threads} thread(s), "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, median of {args.repeats}"
    )
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, rate in medians.items():
        print(f"{name:<11} {rate:9.1f} tokens/s   ({counts[name]} tokens)")
    print(f"ratio evald / per_prompt: {medians['evald'] / medians['per_prompt']:.2f}x (target >= 3)")
    print(f"ratio evald / batched:    {medians['evald'] / medians['batched']:.2f}x (target >= 1.2)")


if __name__ == "__main__":
    main()
