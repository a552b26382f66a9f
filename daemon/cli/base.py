"""What every command shares: the config ``--config`` names (whole, or its database URL alone), its
database at the current schema, and the terminal's width."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import TYPE_CHECKING

from daemon.config.database_url import read_url
from daemon.config.document import config_path

if TYPE_CHECKING:
    from daemon.config import Config
    from storage.database import Database


def load(args: argparse.Namespace) -> Config:
    """The whole config, every section validated (what the daemon would start with)."""
    from daemon.config import load_config

    return load_config(config_path(args.config))


def database_url(args: argparse.Namespace) -> str:
    """The database URL alone, for a command that reads only what is stored (``results``, ``samples``,
    ``history``, ``alerts``, ``compare``, ``retry``): no section is validated nor its model imported, so
    such a command answers in a fraction of the time, and while the rest of the file is being edited
    (``evald config check`` checks it)."""
    return read_url(config_path(args.config))


def open_current(url: str) -> Database:
    """The database at ``url``, refused unless its schema is the current one (``evald db upgrade``)."""
    from storage import schema
    from storage.database import Database

    database = Database(url)
    schema.require_current(database)
    return database


def terminal_width() -> int | None:
    """The terminal's columns, errors being cut to fit them (``status``, ``history``); None when the
    output is not a terminal (a file, a pipe: errors keep a fixed length of their first line)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns
