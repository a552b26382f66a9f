"""Generation engines on long, uneven responses: the continuous engine against the fixed one, in one process.

The model is the 4-layer Llama of ``bench.generation_throughput`` (3.2 M parameters, the toy tokenizer,
random weights from a fixed seed) on the CPU; ``--prompts`` prompts spread like a real eval set's
(8 to 200 characters). Response lengths are long-tailed like reasoning traces: each prompt has a token
budget of its own, drawn from a fixed seed, 4 to 32 tokens for nine prompts in ten and ``--long`` for
the tenth (a random-weight model never says EOS by itself, so the budget is where each response ends,
on both engines alike). Both decode greedily with the same batch size (sequences held at once) and
must produce the same tokens; the run stops with an error if they do not.

Each engine runs ``--repeats`` times, alternating, after a warm-up; medians are reported, with the ratio
of the continuous engine's tokens/s to the fixed engine's (goal >= 3).

    python -m bench.engine_throughput [--prompts 256] [--batch-size 32] [--long 512] [--threads 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

from bench.generation_throughput import build, make_prompts


def budgets(count: int, long: int, seed: int) -> list[int]:
    """Per-prompt token budgets: 4-32 for nine in ten, ``long`` for every tenth (shuffled)."""
    rng = random.Random(seed)
    lengths = [long if i % 10 == 0 else rng.randint(4, 32) for i in range(count)]
    rng.shuffle(lengths)
    return lengths


def requests(tokenizer: Any, prompts: Sequence[str], lengths: Sequence[int]) -> list[Any]:
    from inference.engines import Request

    ids = tokenizer(list(prompts))["input_ids"]
    return [
        Request(index=i, prompt_ids=tuple(ids[i]), key=i, max_new_tokens=lengths[i])
        for i in range(len(prompts))
    ]


def run(engine: str, model: Any, tokenizer: Any, work: Sequence[Any], batch: int, long: int) -> Any:
    from inference.engines import build_engine
    from inference.generation import Decoding

    return build_engine(engine, model, tokenizer, batch_size=batch).run(work, Decoding(max_new_tokens=long))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--long", type=int, default=512, help="budget of the long tenth")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    model, tokenizer = build(args.seed)
    model.config.max_position_embeddings = max(512, 200 + args.long + 1)
    prompts = make_prompts(args.prompts, args.seed)
    lengths = budgets(args.prompts, args.long, args.seed)
    work = requests(tokenizer, prompts, lengths)
    for engine in ("fixed", "continuous"):  # warm-up: kernels, allocator
        run(engine, model, tokenizer, work[: args.batch_size], args.batch_size, 8)
    seconds: dict[str, list[float]] = {"fixed": [], "continuous": []}
    outputs: dict[str, Any] = {}
    for _ in range(args.repeats):
        for engine in seconds:
            started = time.perf_counter()
            outputs[engine] = run(engine, model, tokenizer, work, args.batch_size, args.long)
            seconds[engine].append(time.perf_counter() - started)
    fixed, continuous = (outputs[e].generations for e in ("fixed", "continuous"))
    differing = [i for i in range(len(work)) if fixed[i] != continuous[i]]
    if differing:
        raise SystemExit(f"outputs differ for {len(differing)} prompts, e.g. prompt {differing[0]}")
    tokens = sum(g.tokens for gens in fixed.values() for g in gens)
    short = sum(1 for n in lengths if n <= 32)
    print(
        f"{args.prompts} prompts, budgets: {short} of 4-32 tokens, {args.prompts - short} of {args.long}; "
        f"batch {args.batch_size}, {args.threads} thread(s), greedy, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, median of {args.repeats}"
    )
    rates = {}
    for engine, values in seconds.items():
        wall = statistics.median(values)
        rates[engine] = tokens / wall
        print(f"{engine:<11} {wall:8.2f} s  {rates[engine]:9.1f} tokens/s   ({tokens} tokens, equal outputs)")
    print(f"ratio continuous / fixed: {rates['continuous'] / rates['fixed']:.2f}x (goal >= 3)")


if __name__ == "__main__":
    main()
