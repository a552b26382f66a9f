"""Load a checkpoint sharded across a tensor-parallel group with DeepSpeed AutoTP.

The model is built with its parameters on the meta device (no rank materialises the whole model; the
non-persistent buffers, such as rotary frequencies, are built for real because no checkpoint holds
them), and ``deepspeed.init_inference`` loads the safetensors shards one at a time, each rank keeping
only its slice. At tp = 1 there is nothing to shard: transformers loads the model and DeepSpeed wraps it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.errors import CheckpointInvalid
from inference.layouts import hf

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup
    from transformers import PreTrainedModel


def shard_files(directory: Path) -> list[str]:
    """The safetensors files holding the weights, as named in the index (or the single file)."""
    index = directory / hf.INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return sorted(set(weight_map.values()))
    if (directory / hf.SINGLE_FILE).is_file():
        return [hf.SINGLE_FILE]
    raise CheckpointInvalid(f"{directory}: no safetensors weights to shard")


def stored_names(directory: Path, files: list[str]) -> set[str]:
    """Every tensor name in the shards, from their headers only."""
    from safetensors import safe_open

    names: set[str] = set()
    for name in files:
        with safe_open(str(directory / name), framework="pt") as handle:
            names.update(handle.keys())
    return names


def check_complete(model: torch.nn.Module, stored: set[str], *, tied: bool, where: Path) -> None:
    """Every parameter must come from the checkpoint: DeepSpeed would fill a missing one with garbage."""
    wanted = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    missing = sorted(wanted - stored - ({"lm_head.weight"} if tied else set()))
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CheckpointInvalid(f"{where}: weights missing for {shown}")


def load_sharded(
    directory: Path, *, dtype: torch.dtype, tp: int, tp_group: ProcessGroup | None
) -> PreTrainedModel:
    """The model of ``directory`` (a safetensors ``save_pretrained`` folder), its weights split over the
    ``tp`` ranks of ``tp_group`` (tp > 1)."""
    import deepspeed
    from accelerate import init_empty_weights
    from deepspeed.inference.engine import InferenceEngine
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=False)
    # Through Any: transformers' auto classes are untyped.
    auto: Any = AutoModelForCausalLM
    with init_empty_weights(include_buffers=False):
        model: Any = auto.from_config(config, dtype=dtype, trust_remote_code=False)
    files = shard_files(directory)
    check_complete(
        model,
        stored_names(directory, files),
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        where=directory,
    )
    # DeepSpeed 0.19 builds its tp group from ranks 0..tp-1 and ignores tensor_parallel.tp_group; a group
    # set here first is used instead, so each data-parallel replica shards over its own ranks.
    InferenceEngine.inference_mp_group = tp_group
    engine = deepspeed.init_inference(
        model,
        tensor_parallel={"tp_size": tp},
        dtype=dtype,
        replace_with_kernel_inject=False,
        checkpoint={"type": "ds_model", "checkpoints": files, "version": 1.0},
        base_dir=str(directory),
    )
    loaded: PreTrainedModel = engine.module
    if (directory / "generation_config.json").is_file():
        loaded.generation_config = GenerationConfig.from_pretrained(directory, local_files_only=True)
    return loaded


def wrap_unsharded(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A whole model (tp = 1) under DeepSpeed's inference engine, on its accelerator."""
    import deepspeed

    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": 1}, dtype=dtype)
    wrapped: PreTrainedModel = engine.module
    return wrapped
