"""The schema revision: the one this code needs, and the one a database has, read without alembic.

Every command that opens the database checks its revision first (:func:`require_current`). Alembic would
answer by importing itself (with mako and pygments) and reading every migration file to find the newest;
here the newest is a constant, :data:`HEAD_REVISION`, and the database's own is one ``SELECT`` from the
table alembic keeps it in. ``tests/test_storage.py`` loads the migrations and holds the constant equal to
alembic's head, and this reader equal to alembic's on the same databases: a new migration without the
constant moved fails there, not in the field.
"""

from __future__ import annotations

from sqlalchemy import inspect, text

from storage.database import Database, describe_url
from storage.errors import SchemaOutdated

#: The newest migration in ``alembic/versions`` (its ``revision``); moved with every new migration.
HEAD_REVISION = "0013"
#: Alembic's table for the revision a database is at (its default name; ``alembic/env.py`` keeps it).
VERSION_TABLE = "alembic_version"


def current_revision(database: Database) -> str | None:
    """The revision the database is at; None for a database evald never migrated (no version table, or
    an empty one, as alembic reads them)."""
    with database.engine.connect() as conn:
        if not inspect(conn).has_table(VERSION_TABLE):
            return None
        found = [str(v) for v in conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()]
    if len(found) > 1:
        # A branched history, which evald's linear migrations never make: someone else's alembic.
        several = ", ".join(sorted(found))
        raise SchemaOutdated(
            f"database {describe_url(database.url)} has several schema revisions ({several}) "
            f"in {VERSION_TABLE}: not a schema evald made"
        )
    return found[0] if found else None


def require_current(database: Database) -> None:
    """Refuse to work on a database whose schema is older (or newer) than this code."""
    database.check_reachable()
    current = current_revision(database)
    if current != HEAD_REVISION:
        found = "no evald schema" if current is None else f"schema revision {current}"
        raise SchemaOutdated(
            f"database {describe_url(database.url)} has {found}, this evald needs {HEAD_REVISION}: "
            "run `evald db upgrade`"
        )
