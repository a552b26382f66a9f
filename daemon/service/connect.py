"""Opens the daemon's database at start: the current schema insisted on, the single-daemon lock taken.

An outage at start is waited out for ``database.start_timeout_secs``, backing off as the loop does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from daemon.config import Config
from daemon.outage import Outage
from storage import migrations
from storage.database import Database, describe_url, is_outage, reason
from storage.errors import DatabaseUnreachable


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
