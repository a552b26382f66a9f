"""``evald db upgrade``: the database's schema brought to the current revision."""

from __future__ import annotations

import argparse

from daemon.cli.base import load
from storage import migrations
from storage.database import Database, describe_url


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    config = load(args)
    database = Database(config.database.url)
    try:
        before, after = migrations.upgrade(database)
    finally:
        database.dispose()
    where = describe_url(config.database.url)
    if before == after:
        print(f"{where}: already at revision {after}")
    else:
        print(f"{where}: upgraded from {before or 'empty'} to revision {after}")
    return 0
