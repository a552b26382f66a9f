"""Alembic environment: the URL comes from evald (``evald db upgrade``) or ``EVALD_DATABASE_URL``."""

from __future__ import annotations

import os

from sqlalchemy import Connection

from alembic import context
from storage.database import Database
from storage.migrations import schema_transaction
from storage.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("EVALD_DATABASE_URL")
    if not url:
        raise SystemExit("alembic: set EVALD_DATABASE_URL or sqlalchemy.url")
    database = Database(url)
    try:
        with schema_transaction(database) as conn:
            _run(conn)
    finally:
        database.dispose()


if context.is_offline_mode():
    raise SystemExit("alembic: offline (SQL script) mode is not supported; run against a database")
run_migrations_online()
