"""Paths in a config file are relative to the file's folder, whichever section they sit in.

The loader passes that folder as the validation context (``base_dir``); a model validated without one
(built in code, a test) resolves against the working directory.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationInfo


def base_dir(info: ValidationInfo) -> Path:
    context = info.context if isinstance(info.context, dict) else {}
    base = context.get("base_dir")
    return base if isinstance(base, Path) else Path.cwd()


def resolve_path(value: Path, info: ValidationInfo) -> Path:
    value = value.expanduser()
    return value if value.is_absolute() else (base_dir(info) / value).resolve()
