"""Checkpoint layouts: recognise a folder, judge whether it is complete, say its step, load it.

Each layout is a module with one :class:`Layout` subclass; this registry imports them lazily so the
daemon pays only for what it uses. ``auto`` tries them in :data:`AUTO_ORDER`: the layouts that recognise
a folder by its name or by a tell-tale sub-folder first, plain ``save_pretrained`` last.
"""

from __future__ import annotations

import importlib
from functools import cache
from pathlib import Path

from inference.errors import FileRefused
from inference.layouts import files, hf
from inference.layouts.base import (
    STEP_MAX,
    FileStat,
    Layout,
    LayoutSettings,
    Readiness,
    Shape,
    Snapshot,
    Verdict,
    is_ignored_name,
    parse_step,
    step_problem,
    take_snapshot,
)

#: name → "module:Class". Names are what ``runs[].layout`` and the job spec use.
REGISTRY: dict[str, str] = {
    "hf": "inference.layouts.hf:HfLayout",
    "hf_trainer": "inference.layouts.hf_trainer:HfTrainerLayout",
    "deepspeed": "inference.layouts.deepspeed:DeepSpeedLayout",
    "dcp": "inference.layouts.dcp:DcpLayout",
    "verl": "inference.layouts.verl:VerlLayout",
    "areal": "inference.layouts.areal:ArealLayout",
    "openrlhf": "inference.layouts.openrlhf:OpenRlhfLayout",
    "lora": "inference.layouts.lora:LoraLayout",
}
AUTO_ORDER = ("lora", "hf_trainer", "verl", "areal", "openrlhf", "deepspeed", "dcp", "hf")

__all__ = [
    "AUTO_ORDER",
    "REGISTRY",
    "STEP_MAX",
    "FileStat",
    "Layout",
    "LayoutSettings",
    "Readiness",
    "Shape",
    "Snapshot",
    "Verdict",
    "available",
    "detect",
    "get",
    "hf",
    "inspect",
    "is_ignored_name",
    "parse_step",
    "step_problem",
    "take_snapshot",
]


@cache
def get(name: str) -> Layout:
    """The layout called ``name``; ``KeyError`` naming the known ones if there is none."""
    target = REGISTRY.get(name)
    if target is None:
        raise KeyError(f"unknown layout {name!r} (known: {', '.join(REGISTRY)})")
    module, _, cls = target.partition(":")
    layout: Layout = getattr(importlib.import_module(module), cls)()
    return layout


@cache
def available() -> tuple[str, ...]:
    """Registered layouts whose module exists in this installation, in auto-detection order."""
    found = []
    for name in AUTO_ORDER:
        try:
            get(name)
        except ModuleNotFoundError:
            continue
        found.append(name)
    return tuple(found)


def detect(directory: Path, snapshot: Snapshot, configured: str) -> str | None:
    """The layout of a folder, or ``None`` while nothing in it is recognisable yet."""
    if configured != "auto":
        return configured
    for name in available():
        if get(name).recognise(directory, snapshot):
            return name
    return None


def inspect(
    directory: Path, snapshot: Snapshot, layout: str, settings: LayoutSettings | None = None
) -> Verdict:
    """Readiness of ``directory`` by ``layout``; a FIFO, socket or device anywhere in it makes it invalid
    first, named, since the worker would block reading it wherever it lies."""
    try:
        chosen = get(layout)
    except KeyError as exc:
        return Verdict(Readiness.INVALID, str(exc.args[0]))
    special = snapshot.special()
    if special:
        return Verdict(
            Readiness.INVALID,
            f"{special[0].relpath} is {files.kind(special[0].file_type)}, not a regular file",
            final=True,
        )
    try:
        return chosen.inspect(directory, snapshot, settings or LayoutSettings())
    except FileRefused as exc:
        return files.refusal(directory, exc)
