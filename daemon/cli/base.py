"""What every command shares: the config ``--config`` names, and its database at the current schema."""

from __future__ import annotations

import argparse

from daemon.config import Config, config_path, load_config
from storage import migrations
from storage.database import Database


def load(args: argparse.Namespace) -> Config:
    return load_config(config_path(args.config))


def open_current(config: Config) -> Database:
    """The configured database, refused unless its schema is the current one (``evald db upgrade``)."""
    database = Database(config.database.url)
    migrations.require_current(database)
    return database
