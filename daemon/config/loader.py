"""Reading the TOML config: the file (:mod:`.document`), ``EVALD_<SECTION>_<FIELD>`` overrides, and every
problem at once.

Every problem is reported with its path in the file (``tasks[1].dataset: file not found: ...``), all of
them at once. Relative paths are relative to the config file. ``EVALD_<SECTION>_<FIELD>`` environment
variables override scalar fields of the top-level sections (``EVALD_DATABASE_URL``), so secrets and the
database URL need not live in the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from daemon.config.document import env_name, format_errors, read_document
from daemon.config.executor import ExecutorConfig
from daemon.config.model import ENV_SECTIONS, Config
from daemon.errors import ConfigError


def env_overrides() -> dict[str, tuple[str, str]]:
    """Every ``EVALD_<SECTION>_<FIELD>`` variable name, with the (section, field) it sets."""
    names: dict[str, tuple[str, str]] = {}
    for section in ENV_SECTIONS:
        model: type[BaseModel] = Config.model_fields[section].annotation  # type: ignore[assignment]
        for field in model.model_fields:
            names[env_name(section, field)] = (section, field)
    return names


def apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``EVALD_<SECTION>_<FIELD>`` variables on the parsed file."""
    merged = dict(data)
    for name, (section, field) in env_overrides().items():
        value = environ.get(name)
        if value is not None:
            merged[section] = {**merged.get(section, {}), field: value}
    return merged


def parse_config(
    data: dict[str, Any], *, base_dir: Path, source: str, environ: Mapping[str, str] | None = None
) -> Config:
    environ = os.environ if environ is None else environ
    try:
        return Config.model_validate(
            apply_env(data, environ), context={"base_dir": base_dir, "environ": environ}
        )
    except ValidationError as exc:
        raise ConfigError(source, format_errors(exc)) from exc


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> Config:
    data = read_document(path)
    return parse_config(data, base_dir=path.resolve().parent, source=str(path), environ=environ)


class _ExecutorOnly(BaseModel):
    """The part of a config file :func:`parse_executor` reads (the rest is ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    executor: ExecutorConfig = ExecutorConfig()


def parse_executor(data: Mapping[str, Any], *, base_dir: Path, source: str) -> ExecutorConfig:
    """``[executor]`` of a parsed config file; :class:`ConfigError` lists each problem with its path."""
    try:
        return _ExecutorOnly.model_validate(dict(data), context={"base_dir": base_dir}).executor
    except ValidationError as exc:
        raise ConfigError(source, format_errors(exc)) from exc
