"""What every command shares: the config ``--config`` names, its database at the current schema, and the
terminal's width."""

from __future__ import annotations

import argparse
import shutil
import sys

from daemon.config import Config, config_path, load_config
from storage import schema
from storage.database import Database


def load(args: argparse.Namespace) -> Config:
    return load_config(config_path(args.config))


def open_current(config: Config) -> Database:
    """The configured database, refused unless its schema is the current one (``evald db upgrade``)."""
    database = Database(config.database.url)
    schema.require_current(database)
    return database


def terminal_width() -> int | None:
    """The terminal's columns, errors being cut to fit them (``status``, ``history``); None when the
    output is not a terminal (a file, a pipe: errors keep a fixed length of their first line)."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns
