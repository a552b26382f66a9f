"""Opens the daemon's database at start: the current schema insisted on, the single-daemon lock taken.

The embedded default (a SQLite file) creates itself: a new, empty file gets evald's schema at the first
start (``db.created``). A database that has a schema, older or of another program's, and any PostgreSQL
database, keep the explicit ``evald db upgrade``: migrating a server's data is its operator's decision.

An outage at start is waited out for ``database.start_timeout_secs``, backing off as the loop does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from sqlalchemy import inspect
from sqlalchemy.exc import DBAPIError

from daemon.config import Config
from daemon.outage import Outage
from storage import migrations
from storage.database import Database, describe_url, is_outage, reason
from storage.errors import DatabaseUnreachable

log = structlog.get_logger("evald.service")


def open_database(
    config: Config,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Database:
    """Connect, insist on the current schema, and take the single-daemon lock where one is needed.

    A database that does not answer is tried again for ``database.start_timeout_secs``; after that the
    error says how long it waited, and the caller exits non-zero so that the supervisor starts it again.
    """
    database = Database(config.database.url)
    timeout = config.database.start_timeout_secs
    deadline = clock() + timeout
    outage = Outage(cap_secs=config.database.retry_max_secs)
    try:
        while True:
            try:
                _create_embedded(database)
                migrations.require_current(database)
                database.lock_instance()
            except (DatabaseUnreachable, DBAPIError) as exc:
                if not is_outage(exc):
                    raise
                wait = outage.failed(exc, where="start")
                if clock() + wait > deadline:
                    where = describe_url(database.url)
                    raise DatabaseUnreachable(
                        f"cannot reach database {where} (gave up after {timeout:g} s, "
                        f"database.start_timeout_secs): {reason(exc)}"
                    ) from exc
                sleep(wait)
                continue
            outage.succeeded()
            return database
    except BaseException:
        database.dispose()
        raise


def _create_embedded(database: Database) -> None:
    """Give a new SQLite database evald's schema; anything else is left as it is."""
    if database.engine.dialect.name != "sqlite":
        return
    with database.engine.connect() as conn:
        if inspect(conn).get_table_names():
            return  # evald's schema at some revision, or another program's tables: never touched here
    _, revision = migrations.upgrade(database)
    log.info("db.created", database=describe_url(database.url), revision=revision)
