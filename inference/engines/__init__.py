"""Generation engines: one contract (:mod:`inference.engines.base`), one file per way of running it.

- ``fixed`` (:mod:`inference.engines.fixed`): left-padded batches through transformers' ``generate``,
  each until its longest row ends; any tp (DeepSpeed AutoTP).
- ``continuous`` (:mod:`inference.engines.continuous`): a slot freed by a finished sequence is refilled
  at once from the waiting prompts; tp = 1.
- ``paged`` (:mod:`inference.engines.paged`): the same over a pool of KV blocks sized for the device, so
  memory follows the live tokens; tp = 1.

``[inference] batching`` picks one; ``auto`` picks by :func:`resolve`'s rule, which follows what
``bench/engine_throughput.py`` and ``bench/gpu_check.sh`` measured (BENCHMARKS.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from inference.engines.base import Engine, EngineRun, Request

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from inference.engines.batches import Batch

#: Engine name -> ``module:class``, imported when used (the fixed engine needs no slot cache).
ENGINES: dict[str, str] = {
    "fixed": "inference.engines.fixed:FixedEngine",
    "continuous": "inference.engines.continuous:ContinuousEngine",
    "paged": "inference.engines.paged:PagedEngine",
}

#: What ``[inference] batching`` accepts.
Batching = Literal["auto", "fixed", "continuous", "paged"]

#: Per device type, the engine ``auto`` picks at tp = 1: the faster one in the benchmarks (BENCHMARKS.md,
#: "Generation engines"). A device type not listed gets the fixed engine.
MEASURED_FASTER: dict[str, str] = {"cpu": "continuous"}


def tp_limit(batching: str, tp: int) -> str | None:
    """Why ``batching`` cannot run at ``tp``, or None."""
    if batching in ("continuous", "paged") and tp > 1:
        return (
            f'batching = "{batching}" runs at tp = 1 only (tp = {tp}): its per-step admissions and ends '
            'are not voted across tp ranks; use "auto" (fixed batches at tp > 1) or "fixed"'
        )
    return None


def resolve(batching: str, *, device: str, tp: int) -> str:
    """The engine a job runs: ``batching`` itself, or for ``auto`` the measured-faster one for the device
    at tp = 1 and ``fixed`` at tp > 1."""
    if batching != "auto":
        return batching
    if tp > 1:
        return "fixed"
    return MEASURED_FASTER.get(device.split(":", 1)[0], "fixed")


def build_engine(
    name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, batch_size: int
) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}: one of {sorted(ENGINES)}")
    module, attribute = ENGINES[name].split(":")
    engine: type[Engine] = getattr(importlib.import_module(module), attribute)
    return engine(model, tokenizer, batch_size=batch_size)


def requests_of(batches: Sequence[Batch], item_keys: Sequence[int] | None = None) -> list[Request]:
    """The prompts of left-padded ``batches`` as requests, padding dropped; ``item_keys`` maps a prompt
    index to its item's position in the eval set (default: the index)."""
    requests = []
    for batch in batches:
        for row, index in enumerate(batch.indices):
            ids = batch.input_ids[row][batch.attention_mask[row].bool()].tolist()
            key = item_keys[index] if item_keys is not None else index
            requests.append(Request(index=index, prompt_ids=tuple(ids), key=key))
    return requests


__all__ = ["ENGINES", "Batching", "Engine", "EngineRun", "Request", "build_engine", "requests_of", "resolve"]
