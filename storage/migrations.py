"""Schema migrations: apply them (alembic), and the newest one read from the migration files.

Alembic (with mako and pygments) is imported by the calls that migrate or read the migration files, not
by importing this module: whether a database is at the newest revision is :mod:`storage.schema`'s, which
needs neither, and the daemon, the web server and every CLI command ask it before they start.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from storage.database import Database
from storage.errors import SchemaOutdated, StatementFailed
from storage.schema import current_revision, require_current

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["current_revision", "downgrade", "head_revision", "require_current", "upgrade"]

#: The repository keeps migrations beside the import packages, as the design card draws it.
ALEMBIC_DIR = Path(__file__).resolve().parent.parent / "alembic"


def _config() -> Config:
    from alembic.config import Config

    if not (ALEMBIC_DIR / "env.py").is_file():
        raise SchemaOutdated(f"migrations not found at {ALEMBIC_DIR}: install evald from its repository")
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    return config


def head_revision() -> str:
    """The newest revision in the migration files (:data:`storage.schema.HEAD_REVISION` is kept equal)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise SchemaOutdated(f"no migrations in {ALEMBIC_DIR}")
    return head


def upgrade(database: Database, revision: str = "head") -> tuple[str | None, str]:
    """Apply every pending migration up to ``revision``; returns (revision before, revision after)."""
    from alembic import command

    database.check_reachable()
    before = current_revision(database)
    config = _config()
    with schema_transaction(database) as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return before, head_revision() if revision == "head" else revision


def downgrade(database: Database, revision: str) -> None:
    """Undo migrations down to ``revision`` (what ``alembic downgrade`` does, in the same transaction)."""
    from alembic import command

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
