"""Sharded loading: meta-device build + DeepSpeed AutoTP shard loading against a raw read of the files.

The checkpoint is bench.weight_loading's (a Llama of about 270 M parameters in float32, 1.08 GB, five
safetensors shards). ``--tp N`` starts N ranks under torchrun, each of which builds the model on the
meta device and lets ``deepspeed.init_inference`` load the shards, keeping its 1/N slice (``--tp 1``
loads with transformers and wraps the model in DeepSpeed's engine, as evald does at tp = 1). The
baseline, in the same run and alternating with it, is one sequential read of every shard file into a
buffer by rank 0 while the other ranks wait. Page cache warm for both; medians reported. The ratio is
the load (slowest rank) over the raw read.

    python -m bench.sharded_loading [--tp 2] [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.weight_loading import SHARDS, raw_read, write_checkpoint


def rank_main(folder: Path, tp: int, repeats: int, out: Path) -> None:
    """One rank of the measurement (under torchrun when tp > 1)."""
    import torch

    from inference.group import WorkerGroup
    from inference.loader import load_model
    from inference.spec import InferenceSpec

    spec = InferenceSpec(tp=tp)
    group = WorkerGroup.start(spec)
    rank = group.topology.rank

    def barrier() -> None:
        if group.distributed:
            torch.distributed.barrier()

    def load() -> tuple[float, int]:
        started = time.perf_counter()
        loaded = load_model(folder, spec, tp_group=group.tp_group, scratch=out.parent / f"scratch-{rank}")
        module: torch.nn.Module = loaded.model
        with torch.no_grad():
            if sum(float(p.sum()) for p in module.parameters()) != sum(
                float(p.sum()) for p in module.parameters()
            ):
                raise RuntimeError("loaded weights contain NaN")
        held = sum(p.numel() * p.element_size() for p in module.parameters())
        return time.perf_counter() - started, held

    raw_read(folder)
    load()  # imports, DeepSpeed's op builds, page cache
    raw_times, load_times, held = [], [], 0
    for _ in range(repeats):
        barrier()
        if rank == 0:
            started = time.perf_counter()
            raw_read(folder)
            raw_times.append(time.perf_counter() - started)
        barrier()
        seconds, held = load()
        slowest = [seconds]
        if group.distributed:
            gathered: list[float | None] = [None] * tp
            torch.distributed.all_gather_object(gathered, seconds)
            slowest = [max(s for s in gathered if s is not None)]
        load_times.append(slowest[0])
    if rank == 0:
        out.write_text(json.dumps({"raw": raw_times, "load": load_times, "held_bytes_per_rank": held}))
    group.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="write (or reuse) the checkpoint here")
    parser.add_argument("--rank-of", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from inference.worker import quiet_libraries

    quiet_libraries()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if args.rank_of is not None:
        rank_main(args.keep, args.tp, args.repeats, args.rank_of)
        return
    with tempfile.TemporaryDirectory(prefix="evald-sharded-") as tmp:
        folder = args.keep or Path(tmp) / "ckpt"
        if not (folder / "model.safetensors.index.json").exists():
            write_checkpoint(folder)
        out = Path(tmp) / "figures.json"
        common = [
            "--tp",
            str(args.tp),
            "--repeats",
            str(args.repeats),
            "--keep",
            str(folder),
            "--rank-of",
            str(out),
        ]
        if args.tp == 1:
            command = [sys.executable, "-m", "bench.sharded_loading", *common]
        else:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={args.tp}",
            ]
            command += ["--module", "bench.sharded_loading", *common]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        figures = json.loads(out.read_text())
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    raw, load = statistics.median(figures["raw"]), statistics.median(figures["load"])
    print(f"checkpoint: {size / 1e9:.2f} GB in {SHARDS} safetensors shards (page cache warm), tp = {args.tp}")
    print(f"raw read     median {raw:.3f} s  runs {[round(v, 3) for v in figures['raw']]}")
    print(f"sharded load median {load:.3f} s  runs {[round(v, 3) for v in figures['load']]}  (slowest rank)")
    print(f"parameters held per rank: {figures['held_bytes_per_rank'] / 1e9:.2f} GB of {size / 1e9:.2f} GB")
    print(f"ratio sharded load / raw read: {load / raw:.2f}x")


if __name__ == "__main__":
    main()
