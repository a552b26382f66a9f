"""Schema migrations: apply them, and tell whether a database is at the newest one."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from alembic import command
from storage.database import Database, describe_url
from storage.errors import SchemaOutdated

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
    with database.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return before, head_revision() if revision == "head" else revision


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
