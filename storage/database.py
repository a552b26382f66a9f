"""Engines and sessions: the one place that knows how each backend is configured."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from storage.errors import DatabaseUnreachable, InstanceLocked

#: How long SQLite waits for another writer before giving up, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 10_000


def _configure_sqlite(engine: Engine, *, read_only: bool = False) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the sqlite3 module so that BEGIN IMMEDIATE below is used.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if read_only:
            # A reader leaves the journal mode to the daemon, and refuses writes even before the file does.
            cursor.execute("PRAGMA query_only=ON")
        else:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # A deferred transaction that later writes can fail with SQLITE_BUSY without waiting; taking the
        # write lock up front makes every writer queue on busy_timeout instead. A reader takes no lock.
        connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def normalise_url(url: str) -> str:
    """Map plain ``postgresql://`` URLs to the psycopg 3 driver that evald ships with."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def describe_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


class Database:
    """An engine plus a session factory; ``session()`` is one transaction."""

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        """``read_only`` opens the database so that no statement can write (``evald serve``): SQLite's
        file is opened with ``mode=ro``, and PostgreSQL sessions default to read-only transactions."""
        try:
            self.url = normalise_url(url)
            parsed = make_url(self.url)
        except ArgumentError as exc:
            raise DatabaseUnreachable(f"database.url: not a database URL: {url!r}") from exc
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self.read_only = read_only
        engine_url: Any = self.url
        kwargs: dict[str, Any] = {"future": True}
        if self.is_sqlite:
            if parsed.database and parsed.database != ":memory:":
                parent = Path(parsed.database).expanduser().resolve().parent
                if not parent.is_dir():
                    raise DatabaseUnreachable(
                        f"cannot open database {describe_url(url)}: folder {parent} does not exist"
                    )
                if read_only:
                    # SQLite's URI form, quoted so a path with '?' or '#' stays a path.
                    location = "file:" + quote(str(Path(parsed.database).expanduser().resolve()))
                    engine_url = parsed.set(database=location, query={"mode": "ro", "uri": "true"})
        else:
            kwargs["pool_pre_ping"] = True
            kwargs["connect_args"] = {"connect_timeout": 10}
            if read_only:
                kwargs["connect_args"]["options"] = "-c default_transaction_read_only=on"
        self.engine = create_engine(engine_url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine, read_only=read_only)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._lock_file: IO[str] | None = None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def check_reachable(self) -> None:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except OperationalError as exc:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise DatabaseUnreachable(f"cannot reach database {describe_url(self.url)}: {reason}") from exc

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self._sessions.begin() as session:
            yield session

    def lock_instance(self) -> None:
        """Hold an exclusive lock so only one daemon schedules from a SQLite file.

        PostgreSQL needs no lock: daemons sharing it claim jobs with ``FOR UPDATE SKIP LOCKED``.
        """
        if not self.is_sqlite:
            return
        database = make_url(self.url).database
        if not database or database == ":memory:":
            return
        lock_path = Path(database).expanduser().resolve().with_suffix(".lock")
        handle = lock_path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            handle.close()
            raise InstanceLocked(
                f"another evald daemon already uses {database} (lock {lock_path} is held); "
                "SQLite allows one daemon per database: use PostgreSQL to run several"
            ) from exc
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._lock_file = handle

    def dispose(self) -> None:
        self.engine.dispose()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
