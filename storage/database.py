"""Engines and sessions: the one place that knows how each backend is configured."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from storage.errors import DatabaseUnreachable, InstanceLocked

if TYPE_CHECKING:
    # The ORM is imported by the first session (storage.models imports it anyway); a reader on a core
    # connection (`evald results`) never imports it.
    from sqlalchemy.orm import Session, sessionmaker

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


#: PostgreSQL SQLSTATEs that mean "the server is not there right now", not "your statement is wrong":
#: class 08 (connection exception), shutting down or starting up (57P01-57P03), too many connections,
#: disk full and out of memory on the server.
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "53300", "53100", "53200"})
#: SQLite's codes for a file that is busy, cannot be opened or cannot be written (sqlite3 names them).
_TRANSIENT_SQLITE = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN")


def is_outage(exc: BaseException) -> bool:
    """Whether a database error is the database being away (retry later) rather than a bad statement.

    Classified once, here: callers retry only what this says yes to.
    """
    if isinstance(exc, DatabaseUnreachable | PoolTimeout):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    sqlite_name = getattr(orig, "sqlite_errorname", None)
    if isinstance(sqlite_name, str):
        return sqlite_name.startswith(_TRANSIENT_SQLITE)
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate is None:
        # psycopg raises OperationalError/InterfaceError without a SQLSTATE for what happens on the
        # client's side: refused, reset, closed connections, timeouts.
        return type(orig).__name__ in ("OperationalError", "InterfaceError")
    return sqlstate.startswith("08") or sqlstate in _TRANSIENT_SQLSTATES


def reason(exc: BaseException) -> str:
    """The driver's first line about ``exc`` (without SQLAlchemy's statement dump)."""
    orig = getattr(exc, "orig", None)
    text_ = str(orig if orig is not None else exc).strip()
    return text_.splitlines()[0] if text_ else type(exc).__name__


def insert_for(session: Session) -> Any:
    """The dialect's ``insert`` (PostgreSQL's or SQLite's), whose ``on_conflict_do_nothing`` makes a write
    idempotent when daemons sharing a database make it at the same moment. Each dialect's module is
    imported here, by the engine that uses it, not by every command that opens a SQLite file."""
    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql

        return postgresql.insert
    from sqlalchemy.dialects import sqlite

    return sqlite.insert


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
            # A restarted server leaves dead connections in the pool: pre-ping replaces them at checkout.
            # Keepalives and a user timeout end a connection whose peer vanished without a reset (a
            # network partition) in about 30 s, instead of blocking the daemon's loop for hours.
            kwargs["pool_pre_ping"] = True
            kwargs["connect_args"] = {
                "connect_timeout": 10,
                "keepalives": 1,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
                "tcp_user_timeout": 30_000,
            }
            if read_only:
                kwargs["connect_args"]["options"] = "-c default_transaction_read_only=on"
        self.engine = create_engine(engine_url, **kwargs)
        if self.is_sqlite:
            _configure_sqlite(self.engine, read_only=read_only)
        self._sessions: sessionmaker[Session] | None = None
        self._lock_file: IO[str] | None = None

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def check_reachable(self) -> None:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except OperationalError as exc:
            raise DatabaseUnreachable(
                f"cannot reach database {describe_url(self.url)}: {reason(exc)}"
            ) from exc

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed when the block ends, rolled back if it raises.

        The database going away (a lost connection, a server restarting, a full disk) is raised as
        :class:`DatabaseUnreachable`, whatever the statement; other errors pass through as they are.
        """
        if self._sessions is None:
            from sqlalchemy.orm import sessionmaker

            self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        with self._outages(), self._sessions.begin() as session:
            yield session

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """One transaction on a core connection, as :meth:`session` is one on an ORM session: for reads
        that need no ORM (:mod:`storage.tables`), which then is never imported."""
        with self._outages(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def _outages(self) -> Iterator[None]:
        """The database going away, raised as :class:`DatabaseUnreachable`; anything else as it is."""
        try:
            yield
        except (DBAPIError, PoolTimeout) as exc:
            if is_outage(exc):
                where = describe_url(self.url)
                raise DatabaseUnreachable(f"database {where} unavailable: {reason(exc)}") from exc
            raise

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
