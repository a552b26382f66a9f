"""GPU sweep: evald's sharded generation at tp = 1, 2, 4, 8 (as many as the node has GPUs).

For each tp, torchrun starts tp ranks that run what a worker runs: ``WorkerGroup.start``, then
``load_model`` (meta-device build + DeepSpeed AutoTP shard loading for tp > 1), then evald's bucketed,
left-padded batched generation over ``--prompts`` prompts (greedy, ``--max-new-tokens``). Reported per
tp: load time, generated tokens/s, the speed-up over tp = 1, and the peak memory of every GPU
(``torch.cuda.max_memory_allocated`` on each rank). Needs no edits on a GPU node:

    python -m bench.gpu_sweep                        # a 1.1 B-parameter Llama written on the spot, bf16
    python -m bench.gpu_sweep --checkpoint /models/x  # a real save_pretrained folder (safetensors)

``--device cpu --size tiny --tp 1,2`` runs the same path on the CPU (gloo), which is how the suite
keeps this script working on machines with no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.generation_throughput import make_prompts

#: Llama shapes of the synthetic checkpoint: ``small`` is TinyLlama-1.1B's, ``tiny`` is for CPU checks.
SIZES: dict[str, dict[str, int]] = {
    "small": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "heads": 32, "kv": 4},
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "heads": 4, "kv": 4},
}


def write_checkpoint(folder: Path, size: str, dtype: str) -> None:
    """A save_pretrained folder with random weights, the toy tokenizer, and 2 GB shards."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from inference.toy.tokenizer import build_tokenizer

    shape = SIZES[size]
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv"],
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model: Any = LlamaForCausalLM(config).to(getattr(torch, dtype))
    # Random weights rarely say EOS, and never should here: every prompt generates all its tokens.
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder, max_shard_size="2GB")
    tokenizer.save_pretrained(folder)


def rank_main(args: argparse.Namespace) -> None:
    import torch

    from inference.generation import Decoding, prepare_batches, run_batches
    from inference.group import WorkerGroup
    from inference.loader import load_model
    from inference.spec import InferenceSpec

    spec = InferenceSpec(tp=args.tp, device=args.device, dtype=args.dtype)
    group = WorkerGroup.start(spec)
    rank = group.topology.rank
    device = group.device if args.device.startswith("cuda") else None
    started = time.perf_counter()
    loaded = load_model(
        args.checkpoint, spec, tp_group=group.tp_group, device=device, scratch=args.out.parent / f"s{rank}"
    )
    load_s = time.perf_counter() - started
    prompts = make_prompts(args.prompts, seed=0)
    batches = prepare_batches(loaded.tokenizer, prompts, args.batch_size)
    decoding = Decoding(max_new_tokens=args.max_new_tokens)
    run_batches(loaded.model, loaded.tokenizer, batches[:1], decoding)  # warm-up: kernels, allocator
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    generated, _ = run_batches(loaded.model, loaded.tokenizer, batches, decoding)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    tokens = sum(g.tokens for gens in generated.values() for g in gens)
    peak = torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else 0
    peaks = group.gather_to_root(peak)
    if rank == 0 and peaks is not None:
        figures = {"tp": args.tp, "load_s": load_s, "seconds": seconds, "tokens": tokens, "peak_bytes": peaks}
        args.out.write_text(json.dumps(figures))
    group.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="a save_pretrained folder (default: write one)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small", help="of the written checkpoint")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--tp", default=None, help="comma-separated (default: 1,2,4,8 up to the GPU count)")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    from inference.worker import quiet_libraries

    quiet_libraries()
    if not args.device.startswith("cuda"):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.out is not None:
        args.tp = int(args.tp)
        rank_main(args)
        return
    sweep = [int(t) for t in args.tp.split(",")] if args.tp else _default_sweep(args.device)
    if not sweep:
        print("no GPU found: run on a GPU node, or try the CPU path with --device cpu --size tiny --tp 1,2")
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="evald-gpu-sweep-") as tmp:
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = Path(tmp) / "ckpt"
            write_checkpoint(checkpoint, args.size, args.dtype)
        for tp in sweep:
            out = Path(tmp) / f"tp{tp}.json"
            rank_args = ["--checkpoint", str(checkpoint), "--device", args.device, "--dtype", args.dtype]
            rank_args += [
                "--tp",
                str(tp),
                "--prompts",
                str(args.prompts),
                "--batch-size",
                str(args.batch_size),
            ]
            rank_args += ["--max-new-tokens", str(args.max_new_tokens), "--out", str(out)]
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={tp}",
            ]
            subprocess.run([*command, "--module", "bench.gpu_sweep", *rank_args], check=True)
            results.append(json.loads(out.read_text()))
    base = results[0]["tokens"] / results[0]["seconds"]
    print(f"{'tp':>3} {'load s':>8} {'tokens/s':>10} {'speed-up':>9}  peak memory per {args.device} (GiB)")
    for r in results:
        rate = r["tokens"] / r["seconds"]
        peaks = " ".join(f"{p / 2**30:.2f}" for p in r["peak_bytes"])
        print(f"{r['tp']:>3} {r['load_s']:>8.2f} {rate:>10.1f} {rate / base:>8.2f}x  {peaks}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


def _default_sweep(device: str) -> list[int]:
    if not device.startswith("cuda"):
        return [1, 2]
    import torch

    count = torch.cuda.device_count()
    return [tp for tp in (1, 2, 4, 8) if tp <= count]


if __name__ == "__main__":
    main()
