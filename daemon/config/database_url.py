"""``[database] url`` read without the config's models: its default, where a relative SQLite path points,
and the file's value with its ``EVALD_DATABASE_URL`` override.

:class:`daemon.config.DatabaseConfig` validates the URL with these rules when the whole file is loaded;
:func:`read_url` reads it alone, for a command that only reads what is stored (``evald results``): the
other sections are neither read nor checked (``evald config check`` does that), and neither pydantic nor
any section's model is imported, a fifth of such a command's time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from daemon.config.document import env_name, read_document
from daemon.errors import ConfigError

#: Where results are kept when the config does not say: beside the config file.
DEFAULT_URL = "sqlite:///evald.db"
_SQLITE = "sqlite:///"


def beside(url: str, base: Path) -> str:
    """A relative SQLite path made absolute against ``base`` (the config's folder): it means "beside the
    config", not "wherever systemd's working directory is". Any other URL is returned as it is."""
    if url.startswith(_SQLITE) and not url.startswith(_SQLITE + "/") and url != _SQLITE + ":memory:":
        return _SQLITE + str((base / url[len(_SQLITE) :]).resolve())
    return url


def read_url(path: Path, environ: Mapping[str, str] | None = None) -> str:
    """The database URL of the config file at ``path``: ``EVALD_DATABASE_URL``, else ``[database] url``,
    else :data:`DEFAULT_URL`, a relative SQLite path made absolute as :func:`beside` says."""
    environ = os.environ if environ is None else environ
    source = str(path)
    document = read_document(path)
    section = document.get("database", {})
    if not isinstance(section, dict):
        raise ConfigError(source, ["database: must be a table ([database])"])
    url = environ.get(env_name("database", "url"), section.get("url", DEFAULT_URL))
    if not isinstance(url, str):
        raise ConfigError(source, ["database.url: must be a string (sqlite:///FILE or postgresql://...)"])
    return beside(url, path.resolve().parent)
