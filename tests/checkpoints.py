"""Real checkpoint files for tests: written by transformers' own ``save_pretrained``.

``replay`` copies a finished checkpoint into a watched folder the way a slow trainer writes it: file by
file in the writer's order, large files in several appends.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path


def save_tiny_llama(directory: Path, *, shard_size: str | None = None, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = LlamaForCausalLM(config)
    if shard_size:
        model.save_pretrained(directory, max_shard_size=shard_size)
    else:
        model.save_pretrained(directory)
    return directory


def write_order(directory: Path) -> list[Path]:
    """Files in the order save_pretrained writes them: config first, shards, the index last."""

    def rank(path: Path) -> tuple[int, str]:
        name = path.name
        if name == "config.json":
            return (0, name)
        if name.endswith(".index.json"):
            return (3, name)
        if name.endswith(".safetensors"):
            return (2, name)
        return (1, name)

    return sorted((p for p in directory.rglob("*") if p.is_file()), key=rank)


def replay(source: Path, target: Path, *, chunks: int = 3) -> Iterator[str]:
    """Write ``source``'s files into ``target`` step by step; yields after every write (a description)."""
    target.mkdir(parents=True, exist_ok=True)
    yield "folder created"
    for path in write_order(source):
        data = path.read_bytes()
        destination = target / path.relative_to(source)
        destination.parent.mkdir(parents=True, exist_ok=True)
        size = max(1, len(data) // chunks)
        with destination.open("wb") as handle:
            for start in range(0, len(data), size):
                handle.write(data[start : start + size])
                handle.flush()
                yield f"{path.name}: {min(start + size, len(data))}/{len(data)} bytes"


def copy_checkpoint(source: Path, target: Path, mutate: Callable[[Path], None] | None = None) -> Path:
    shutil.copytree(source, target)
    if mutate is not None:
        mutate(target)
    return target


@dataclass(frozen=True)
class LayoutCase:
    """A finished checkpoint as a real trainer left it, and how that trainer wrote it.

    ``tests/cases/<layout>.py`` modules build these with the real writer (or the trainer's exact file
    names and write order, cited from its source); the generic slow-writer test replays ``order``
    file by file, large files in several appends, and checks nothing is read early.
    """

    #: Registry name of the layout (``inference.layouts.REGISTRY``).
    layout: str
    #: The run folder the trainer wrote into (what a run's ``root`` points at).
    source: Path
    #: The checkpoint folder, relative to ``source`` (``global_step2``, ``_actor/global_step2``).
    candidate: str
    #: Every file the trainer writes for this checkpoint, relative to ``source``, in write order,
    #: including trackers beside the folder (``latest``) where the trainer writes them last.
    order: tuple[str, ...]
    step: int
    epoch: int | None = None
    #: For tensor-only layouts: the HF config (and tokenizer) folder the run's config names.
    hf_config: Path | None = None
