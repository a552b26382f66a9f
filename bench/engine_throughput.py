"""Generation engines on long, uneven responses: the continuous and paged engines against the fixed one, in
one process.

The model is the 4-layer Llama of ``bench.generation_throughput`` (3.2 M parameters, the toy tokenizer,
random weights from a fixed seed) on the CPU; ``--prompts`` prompts spread like a real eval set's
(8 to 200 characters). Response lengths are long-tailed like reasoning traces: each prompt has a token
budget of its own, drawn from a fixed seed, 4 to 32 tokens for nine prompts in ten and ``--long`` for
the tenth (a random-weight model never says EOS by itself, so the budget is where each response ends,
on every engine alike). All decode greedily with the same batch size (sequences held at once) and
must produce the same tokens; the run stops with an error if they do not.

Each engine runs ``--repeats`` times, alternating, after a warm-up; medians are reported, with the ratio
of the continuous and paged engines' tokens/s to the fixed engine's (goal >= 3), and the most tokens each
continuous engine's KV cache held (whole-length slots against the paged pool's blocks in use).
``--transformers-cb`` also runs transformers' own continuous batching (``ContinuousBatchingManager``,
blocks sized for the CPU: 32-token pages, 1,024 blocks, 512 tokens and 32 requests a batch; its default
sizes sat over 40 s in warm-up here)
on the same work, once, and says whether its texts are the same.

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


ENGINES = ("fixed", "continuous", "paged")


def run(
    engine: str, model: Any, tokenizer: Any, work: Sequence[Any], batch: int, long: int
) -> tuple[Any, int]:
    """The engine's run, and the most tokens its KV cache held (0 for the fixed engine)."""
    from inference.engines import build_engine
    from inference.generation import Decoding

    built = build_engine(engine, model, tokenizer, batch_size=batch)
    done = built.run(work, Decoding(max_new_tokens=long))
    return done, getattr(built, "peak_tokens", 0)


def transformers_cb(
    model: Any, tokenizer: Any, work: Sequence[Any], batch: int, long: int
) -> tuple[float, list[str]]:
    """Seconds (warm-up included) and texts of transformers' continuous batching over ``work``, greedy."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    generation = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=long,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    sizes = ContinuousBatchingConfig(
        page_size=32,
        num_blocks=1024,
        max_batch_tokens=512,
        max_requests_per_batch=batch,
        use_cuda_graph=False,
        use_async_batching=False,
        allow_block_sharing=False,
    )
    started = time.perf_counter()
    finished: dict[str, Any] = {}
    with model.continuous_batching_context_manager(
        generation_config=generation, continuous_batching_config=sizes
    ) as cb:
        ids = [cb.add_request(list(r.prompt_ids), max_new_tokens=r.max_new_tokens) for r in work]
        while len(finished) < len(ids):
            result = cb.get_result(timeout=5)
            if result is not None and result.is_finished():
                finished[result.request_id] = result
    seconds = time.perf_counter() - started
    texts = [tokenizer.decode(finished[i].generated_tokens, skip_special_tokens=True) for i in ids]
    return seconds, texts


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--long", type=int, default=512, help="budget of the long tenth")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transformers-cb", action="store_true", help="also run transformers' own")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    model, tokenizer = build(args.seed)
    model.config.max_position_embeddings = max(512, 200 + args.long + 1)
    prompts = make_prompts(args.prompts, args.seed)
    lengths = budgets(args.prompts, args.long, args.seed)
    work = requests(tokenizer, prompts, lengths)
    for engine in ENGINES:  # warm-up: kernels, allocator
        run(engine, model, tokenizer, work[: args.batch_size], args.batch_size, 8)
    seconds: dict[str, list[float]] = {engine: [] for engine in ENGINES}
    outputs: dict[str, Any] = {}
    peaks: dict[str, int] = {}
    for _ in range(args.repeats):
        for engine in seconds:
            started = time.perf_counter()
            outputs[engine], peaks[engine] = run(engine, model, tokenizer, work, args.batch_size, args.long)
            seconds[engine].append(time.perf_counter() - started)
    fixed, continuous = outputs["fixed"].generations, outputs["continuous"].generations
    for engine in ENGINES[1:]:
        differing = [i for i in range(len(work)) if fixed[i] != outputs[engine].generations[i]]
        if differing:
            raise SystemExit(f"{engine}: outputs differ for {len(differing)} prompts, e.g. {differing[0]}")
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
        held = f", KV cache held at most {peaks[engine]:,} tokens" if peaks[engine] else ""
        figures = f"({tokens} tokens, equal outputs{held})"
        print(f"{engine:<11} {wall:8.2f} s  {rates[engine]:9.1f} tokens/s   {figures}")
    for engine in ENGINES[1:]:
        print(f"ratio {engine} / fixed: {rates[engine] / rates['fixed']:.2f}x (goal >= 3)")
    if args.transformers_cb:
        wall, texts = transformers_cb(model, tokenizer, work, args.batch_size, args.long)
        same = sum(text == continuous[i][0].text for i, text in enumerate(texts))
        rate = tokens / wall
        print(f"transformers CB {wall:8.2f} s  {rate:9.1f} tokens/s   (same text: {same} of {len(texts)})")


if __name__ == "__main__":
    main()
