"""Checkpoint layouts: recognise a directory, judge whether it is complete, say its step.

Only the Hugging Face ``save_pretrained`` layout exists so far; ``detect`` is where others join.
"""

from __future__ import annotations

from pathlib import Path

from inference.layouts import hf
from inference.layouts.base import (
    FileStat,
    Readiness,
    Snapshot,
    Verdict,
    is_ignored_name,
    parse_step,
    take_snapshot,
)

LAYOUTS = (hf.NAME,)

__all__ = [
    "LAYOUTS",
    "FileStat",
    "Readiness",
    "Snapshot",
    "Verdict",
    "detect",
    "inspect",
    "is_ignored_name",
    "parse_step",
    "take_snapshot",
]


def detect(snapshot: Snapshot, configured: str) -> str | None:
    """The layout of a directory, or ``None`` while nothing in it is recognisable yet."""
    if configured != "auto":
        return configured
    if hf.looks_like(snapshot):
        return hf.NAME
    return None


def inspect(directory: Path, snapshot: Snapshot, layout: str) -> Verdict:
    if layout == hf.NAME:
        return hf.inspect(directory, snapshot)
    return Verdict(Readiness.INVALID, f"layout {layout!r} is not supported (known: {', '.join(LAYOUTS)})")
