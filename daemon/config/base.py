"""What every config section shares: a strict, frozen model, and paths relative to the config file.

Paths in a config file are relative to the file's folder, whichever section they sit in. The loader
passes that folder as the validation context (``base_dir``); a model validated without one (built in
code, a test) resolves against the working directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationInfo


@dataclass(frozen=True)
class Written:
    """``Annotated`` metadata: how a value is written in the config file when that is not its Python type
    (a memory size ``"20GiB"`` stored as an ``int`` of bytes); the config reference shows this."""

    form: str


class Section(BaseModel):
    """A config table: an unknown key is an error, and the validated values never change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def base_dir(info: ValidationInfo) -> Path:
    context = info.context if isinstance(info.context, dict) else {}
    base = context.get("base_dir")
    return base if isinstance(base, Path) else Path.cwd()


def resolve_path(value: Path, info: ValidationInfo) -> Path:
    value = value.expanduser()
    return value if value.is_absolute() else (base_dir(info) / value).resolve()


def existing_file(value: Path | None, info: ValidationInfo) -> Path | None:
    """An optional file setting, resolved like any path: it must be a file already."""
    if value is None:
        return None
    path = resolve_path(value, info)
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    return path
