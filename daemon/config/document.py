"""The config file as a document: where it is, its TOML read, and a validation error told as its paths.

What reading any part of the file needs, without the sections' models: :func:`daemon.config.load_config`
validates the whole file with them, :func:`daemon.config.database.load_database` only ``[database]`` (what
a command that reads stored results needs, at a fraction of the cost).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from daemon.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import ValidationError

ENV_PREFIX = "EVALD_"
DEFAULT_CONFIG = Path("evald.toml")


def config_path(explicit: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """``--config``, else ``$EVALD_CONFIG``, else ``./evald.toml``."""
    env = os.environ if environ is None else environ
    return Path(explicit or env.get(f"{ENV_PREFIX}CONFIG") or DEFAULT_CONFIG)


def env_name(section: str, field: str) -> str:
    """The variable that overrides ``section.field``: ``EVALD_DATABASE_URL``."""
    return f"{ENV_PREFIX}{section}_{field}".upper()


def read_document(path: Path) -> dict[str, Any]:
    """The file's TOML; :class:`ConfigError` naming the file where it cannot be read or parsed."""
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(source, ["file not found (pass --config or set EVALD_CONFIG)"]) from exc
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror}"]) from exc
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"not UTF-8 text ({exc.reason} at byte {exc.start})"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from exc


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
