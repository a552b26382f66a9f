"""Schema migrations: apply them, and tell whether a database is at the newest one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from alembic import command
from storage.database import Database, describe_url
from storage.errors import SchemaOutdated, StatementFailed

#: The repository keeps migrations beside the import packages, as the design card draws it.
ALEMBIC_DIR = Path(__file__).resolve().parent.parent / "alembic"


def _config() -> Config:
    if not (ALEMBIC_DIR / "env.py").is_file():
        raise SchemaOutdated(f"migrations not found at {ALEMBIC_DIR}: install evald from its repository")
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise SchemaOutdated(f"no migrations in {ALEMBIC_DIR}")
    return head


def current_revision(database: Database) -> str | None:
    with database.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(database: Database, revision: str = "head") -> tuple[str | None, str]:
    """Apply every pending migration up to ``revision``; returns (revision before, revision after)."""
    database.check_reachable()
    before = current_revision(database)
    config = _config()
    with schema_transaction(database) as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return before, head_revision() if revision == "head" else revision


def downgrade(database: Database, revision: str) -> None:
    """Undo migrations down to ``revision`` (what ``alembic downgrade`` does, in the same transaction)."""
    database.check_reachable()
    config = _config()
    with schema_transaction(database) as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


@contextmanager
def schema_transaction(database: Database) -> Iterator[Connection]:
    """One transaction for migrations. On SQLite, foreign keys are off while it runs and checked before it
    commits, SQLite's own procedure for changing a table: batch mode copies a table, drops the old one and
    renames the copy, and dropping a table with foreign keys on deletes every row that references it
    (results, samples and history cascade from a job). The pragma is a no-op inside a transaction, so it
    is set on the connection before the transaction begins."""
    with database.engine.connect() as conn:
        raw = conn.connection.dbapi_connection if conn.dialect.name == "sqlite" else None
        if raw is not None:
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                yield conn
                if raw is not None:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        tables = sorted({str(row[0]) for row in broken})
                        raise StatementFailed(
                            f"the migration left {len(broken)} row(s) whose foreign key points nowhere "
                            f"(in {', '.join(tables)}): rolled back, nothing changed"
                        )
        finally:
            if raw is not None:
                raw.execute("PRAGMA foreign_keys=ON")


def require_current(database: Database) -> None:
    """Refuse to work on a database whose schema is older (or newer) than this code."""
    database.check_reachable()
    head = head_revision()
    current = current_revision(database)
    if current != head:
        found = "no evald schema" if current is None else f"schema revision {current}"
        raise SchemaOutdated(
            f"database {describe_url(database.url)} has {found}, this evald needs {head}: "
            "run `evald db upgrade`"
        )
