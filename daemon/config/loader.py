"""Reading the TOML config: the file, ``EVALD_<SECTION>_<FIELD>`` overrides, and every problem at once.

Every problem is reported with its path in the file (``tasks[1].dataset: file not found: ...``), all of
them at once. Relative paths are relative to the config file. ``EVALD_<SECTION>_<FIELD>`` environment
variables override scalar fields of the top-level sections (``EVALD_DATABASE_URL``), so secrets and the
database URL need not live in the file.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from daemon.config.executor import ExecutorConfig
from daemon.config.model import ENV_SECTIONS, Config
from daemon.errors import ConfigError

ENV_PREFIX = "EVALD_"
DEFAULT_CONFIG = Path("evald.toml")


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _message(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    message = str(error.get("msg", "invalid"))
    return message.removeprefix("Value error, ")


def format_errors(exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors():
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # Model-level validators report several problems in one message, each already with its path.
        if error["type"] == "value_error" and not loc:
            problems.extend(_message(error).split("; "))
            continue
        problems.append(f"{_location(loc)}: {_message(error)}")
    return problems


def env_overrides() -> dict[str, tuple[str, str]]:
    """Every ``EVALD_<SECTION>_<FIELD>`` variable name, with the (section, field) it sets."""
    names: dict[str, tuple[str, str]] = {}
    for section in ENV_SECTIONS:
        model: type[BaseModel] = Config.model_fields[section].annotation  # type: ignore[assignment]
        for field in model.model_fields:
            names[f"{ENV_PREFIX}{section}_{field}".upper()] = (section, field)
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


def config_path(explicit: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """``--config``, else ``$EVALD_CONFIG``, else ``./evald.toml``."""
    env = os.environ if environ is None else environ
    return Path(explicit or env.get(f"{ENV_PREFIX}CONFIG") or DEFAULT_CONFIG)


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> Config:
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(source, ["file not found (pass --config or set EVALD_CONFIG)"]) from exc
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror}"]) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"not UTF-8 text ({exc.reason} at byte {exc.start})"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from exc
    return parse_config(data, base_dir=path.resolve().parent, source=source, environ=environ)


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
