"""``[daemon]``: the daemon's own state folder and logging."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from daemon.config.base import Section, resolve_path


class DaemonConfig(Section):
    """The daemon's own state folder and its logs."""

    #: Where job specs, results and worker logs are kept.
    state_dir: Path = Field(default=Path("state"), validate_default=True)
    #: Logs as JSON ("json"), human-readable ("console"), or JSON unless stdout is a terminal ("auto").
    log_format: Literal["auto", "json", "console"] = "auto"
    #: The least severe log events written: ``warning`` keeps only problems, ``error`` only failures.
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, value: Path, info: ValidationInfo) -> Path:
        return resolve_path(value, info)
