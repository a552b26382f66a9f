"""Weight loading: evald's loader on a sharded safetensors checkpoint of over 1 GB against a raw read.

The checkpoint is a Llama-architecture model of about 270 M parameters in float32 (1.08 GB) in five
safetensors shards with an index, written once. In the same process, alternating, ``--repeats`` times:
the baseline reads every shard sequentially into a buffer (no parsing, no tensors), then
``inference.loader.load_model`` loads it the way a worker does (readiness check, ``from_pretrained``,
tokenizer). Both run with the files in the page cache, so the ratio is the loader's own overhead over
moving the bytes. Medians are reported.

    python -m bench.weight_loading [--repeats 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

SHARDS = 5


def write_checkpoint(folder: Path) -> int:
    """A real save_pretrained-shaped folder: config, five shards, the index, a tokenizer."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from inference.toy.tokenizer import build_tokenizer

    folder.mkdir(parents=True)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in LlamaForCausalLM(config).state_dict().items()}
    config.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    names = list(shapes)
    per_shard = -(-len(names) // SHARDS)
    weight_map, total = {}, 0
    generator = torch.Generator().manual_seed(0)
    for index in range(SHARDS):
        shard = f"model-{index + 1:05d}-of-{SHARDS:05d}.safetensors"
        tensors = {}
        for name in names[index * per_shard : (index + 1) * per_shard]:
            tensors[name] = torch.randn(shapes[name], generator=generator) * 0.02
            weight_map[name] = shard
            total += tensors[name].numel() * 4
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
    index_doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc))
    return total


def raw_read(folder: Path) -> int:
    buffer = bytearray(16 * 2**20)
    view = memoryview(buffer)
    read = 0
    for shard in sorted(folder.glob("*.safetensors")):
        with shard.open("rb", buffering=0) as handle:
            while n := handle.readinto(view):
                read += n
    return read


def load(folder: Path, *, touch: bool) -> None:
    """Load as a worker does; with ``touch``, also read every parameter once.

    from_pretrained memory-maps safetensors, so a model is usable before its bytes are read; touching
    each parameter (a sum) is the comparable work to the raw read.
    """
    import torch

    from inference.loader import load_model
    from inference.spec import InferenceSpec

    loaded = load_model(folder, InferenceSpec(), layout="hf")
    if touch:
        with torch.no_grad():
            total = sum(float(p.sum()) for p in loaded.model.parameters())
        if total != total:  # NaN: the weights did not load
            raise RuntimeError("loaded weights contain NaN")
    del loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--keep", type=Path, help="write (or reuse) the checkpoint here instead of a temp folder"
    )
    args = parser.parse_args()
    from inference.worker import quiet_libraries

    quiet_libraries()
    with tempfile.TemporaryDirectory(prefix="evald-weights-") as tmp:
        folder = args.keep or Path(tmp) / "ckpt"
        if not (folder / "model.safetensors.index.json").exists():
            write_checkpoint(folder)
        size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        raw_read(folder)  # warm the page cache for both
        load(folder, touch=True)  # and the imports
        times: dict[str, list[float]] = {"raw": [], "load": [], "load+touch": []}
        for _ in range(args.repeats):
            for label, work in (
                ("raw", lambda: raw_read(folder)),
                ("load", lambda: load(folder, touch=False)),
                ("load+touch", lambda: load(folder, touch=True)),
            ):
                started = time.perf_counter()
                work()
                times[label].append(time.perf_counter() - started)
    medians = {label: statistics.median(values) for label, values in times.items()}
    print(f"checkpoint: {size / 1e9:.2f} GB in {SHARDS} safetensors shards (page cache warm)")
    for label, value in medians.items():
        runs = [round(v, 3) for v in times[label]]
        print(f"{label:<11} median {value:.3f} s  ({size / value / 1e9:5.2f} GB/s)  runs {runs}")
    for label in ("load", "load+touch"):
        print(f"ratio {label} / raw read: {medians[label] / medians['raw']:.2f}x (target <= 1.25x)")


if __name__ == "__main__":
    main()
