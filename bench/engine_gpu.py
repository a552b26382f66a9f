"""Generation engines on a GPU: continuous against fixed batches on long-tailed responses, in one call.

Run by ``bench/gpu_check.sh`` (step "engines"); needs only torch and transformers, so it runs on a GPU
image without evald's other dependencies. The model is TinyLlama-1.1B's shape (22 layers, hidden 2048,
32 query heads on 4 key-value heads) with random bf16 weights built on the spot from a ``LlamaConfig``
(nothing is downloaded) and the toy tokenizer's vocabulary. Every prompt has a token budget of its own,
long-tailed like reasoning traces: 4-32 tokens for nine in ten, ``--long`` for the tenth (a random model
never says EOS by itself, so the budget is where each response ends, on both engines alike).

It reports, each as soon as it is measured (and into ``--json``):

1. the bf16 matrix-product peak of this GPU (8192³, mean of 10 after 3 warm-ups): the roofline;
2. fixed against continuous and paged on the first ``--compare`` prompts, same batch size, greedy: wall,
   tokens/s, the ratios, whether the outputs are equal, and the fraction of the roofline reached
   (2 × parameters × tokens/s against the peak; attention's own FLOPs are not counted);
3. each of ``--engines`` on all ``--prompts`` prompts at each ``--concurrency``: tokens/s, roofline
   fraction, peak memory, the most tokens its KV cache held, and how many times it had to halve its load
   after an out-of-memory error (the paged pool takes 80 % of the memory free when it starts);
4. ``--hold`` concurrent sequences of ``--hold-tokens`` tokens each: whether they ran without an
   out-of-memory retry, the peak memory, tokens/s.

    python -m bench.engine_gpu                     # the figures (cuda)
    python -m bench.engine_gpu --tiny              # the same steps, CPU-sized, to check the script runs
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.engine_throughput import budgets, requests
from bench.generation_throughput import make_prompts

SHAPES: dict[str, dict[str, int]] = {
    "small": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "heads": 32, "kv": 4},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "heads": 4, "kv": 2},
}


def build_model(size: str, device: str, dtype: str, context: int) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from inference.toy.tokenizer import build_tokenizer

    shape = SHAPES[size]
    tokenizer = build_tokenizer()
    tokenizer.padding_side = "left"
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"],
        max_position_embeddings=context,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model: Any = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def matmul_peak(device: str) -> float:
    """FLOP/s of a bf16 8192³ matrix product on ``device`` (CPU: float32 1024³, for the dry run)."""
    import torch

    size, dtype = (8192, torch.bfloat16) if device.startswith("cuda") else (1024, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    _sync(device)
    return 2 * size**3 * 10 / (time.perf_counter() - started)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(
    engine: str, model: Any, tokenizer: Any, work: Sequence[Any], batch: int, long: int, device: str
) -> dict[str, Any]:
    """One engine run with torch's out-of-memory error answered as the worker's retry does: half the
    load, again."""
    import torch

    from inference.engines import build_engine
    from inference.generation import Decoding

    retries = 0
    while True:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            built = build_engine(engine, model, tokenizer, batch_size=batch)
            run = built.run(work, Decoding(max_new_tokens=long))
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
            retries, batch = retries + 1, batch // 2
            continue
        _sync(device)
        seconds = time.perf_counter() - started
        tokens = sum(g.tokens for gens in run.generations.values() for g in gens)
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else 0.0
        return {
            "engine": engine,
            "batch": batch,
            "oom_retries": retries,
            "seconds": round(seconds, 2),
            "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1),
            "peak_gib": round(peak, 2),
            "kv_tokens": getattr(built, "peak_tokens", 0),
            "preemptions": getattr(built, "preemptions", 0),
            "generations": run.generations,
        }


def main(argv: Sequence[str] | None = None) -> None:
    """The four steps in order, each reported as it ends (over 60 lines: one step after the other, each
    short, sharing the model and the report)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="CPU-sized dry run of every step")
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--long", type=int, default=4096, help="budget of the long tenth")
    parser.add_argument("--compare", type=int, default=256, help="prompts run by both engines")
    parser.add_argument("--compare-long", type=int, default=1024, help="the long tenth's budget there")
    parser.add_argument("--batch", type=int, default=256, help="batch size of the comparison")
    parser.add_argument("--concurrency", default="128,512", help="comma-separated, for step 3")
    parser.add_argument("--engines", default="continuous,paged", help="comma-separated, for step 3")
    parser.add_argument("--hold", type=int, default=512, help="concurrent sequences of step 4")
    parser.add_argument("--hold-tokens", type=int, default=4096)
    parser.add_argument("--skip", default="", help="comma-separated steps to leave out: compare,sweep,hold")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.tiny:
        args.prompts, args.long, args.compare, args.compare_long, args.batch = 48, 40, 24, 24, 8
        args.concurrency, args.hold, args.hold_tokens = "4,16", 8, 32
    device = "cpu" if args.tiny else "cuda"
    dtype = "float32" if args.tiny else "bfloat16"
    skip = set(filter(None, args.skip.split(",")))

    import torch

    figures: dict[str, Any] = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}

    def report(key: str, value: Any) -> None:
        figures[key] = value
        print(json.dumps({key: value}), flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps(figures, indent=1))

    context = 256 + max(args.long, args.hold_tokens, args.compare_long)
    model, tokenizer = build_model("tiny" if args.tiny else "small", device, dtype, context)
    parameters = sum(p.numel() for p in model.parameters())
    # The embedding is a lookup, not a product: the FLOPs per token are the rest's.
    flops_per_token = 2 * (parameters - model.get_input_embeddings().weight.numel())
    peak = matmul_peak(device)
    report("model", {"parameters": parameters, "dtype": dtype, "peak_tflops": round(peak / 1e12, 1)})

    def roofline(tokens_per_s: float) -> float:
        return round(float(tokens_per_s * flops_per_token / peak), 4)

    prompts = make_prompts(args.prompts, 0)
    if "compare" not in skip:
        work = requests(tokenizer, prompts[: args.compare], budgets(args.compare, args.compare_long, 0))
        timed("continuous", model, tokenizer, work[: args.batch // 4 or 1], args.batch, 8, device)  # warm-up
        timed("fixed", model, tokenizer, work[: args.batch // 4 or 1], args.batch, 8, device)
        timed("paged", model, tokenizer, work[: args.batch // 4 or 1], args.batch, 8, device)
        runs = {
            e: timed(e, model, tokenizer, work, args.batch, args.compare_long, device)
            for e in ("fixed", "continuous", "paged")
        }
        answers = [figure.pop("generations") for figure in runs.values()]
        for figure in runs.values():
            figure["roofline"] = roofline(figure["tokens_per_s"])
        base = runs["fixed"]["tokens_per_s"]
        report(
            "compare",
            {
                "prompts": args.compare,
                "long": args.compare_long,
                **runs,
                "ratio": round(runs["continuous"]["tokens_per_s"] / base, 2),
                "ratio_paged": round(runs["paged"]["tokens_per_s"] / base, 2),
                "equal": all(a == answers[0] for a in answers),
            },
        )
    if "sweep" not in skip:
        work = requests(tokenizer, prompts, budgets(args.prompts, args.long, 0))
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            for engine in args.engines.split(","):
                figure = timed(engine, model, tokenizer, work, concurrency, args.long, device)
                figure.pop("generations")
                key = f"sweep_{concurrency}" if engine == "continuous" else f"sweep_{engine}_{concurrency}"
                report(key, {**figure, "roofline": roofline(figure["tokens_per_s"])})
    if "hold" not in skip:
        ids = tokenizer(prompts[: args.hold])["input_ids"]
        from inference.engines import Request

        work = [Request(index=i, prompt_ids=tuple(x), key=i) for i, x in enumerate(ids)]
        figure = timed("continuous", model, tokenizer, work, args.hold, args.hold_tokens, device)
        figure.pop("generations")
        report("hold", {**figure, "sequences": args.hold, "without_oom_retry": figure["oom_retries"] == 0})


if __name__ == "__main__":
    main()
