"""Fixtures for the daemon and storage tests (a pytest plugin: see ``addopts`` in pyproject.toml).

PostgreSQL tests each get a database of their own, under a name no other test had, so tests never see each
other. Creating one (a copy of a template) and dropping it cost the server about 0.25 CPU-s together, a
twentieth of the suite's CPU: so a database a test is done with is cut off from every connection, renamed
(whatever still holds its old name can no longer reach it) and emptied, and the next test of the process
takes it, where it then equals a new one exactly (its schema, settings and grants compared with a new
one's); else it is dropped. That work runs on threads beside the next tests, and the session's end waits
for it and drops what is left. Where
no server answers they are skipped with a message, unless ``EVALD_REQUIRE_POSTGRES=1`` (set by .ci/run),
which turns the skip into a failure: CI never passes by skipping them.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from storage import migrations
from storage.database import Database
from tests import harness

ADMIN_URL = os.environ.get("EVALD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
HOW_TO = (
    "PostgreSQL is not reachable at {url} ({error}); start it, or point EVALD_TEST_POSTGRES_URL at a server "
    "where the user may CREATE DATABASE, to run these tests"
)


def _admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    return _connect(make_url(ADMIN_URL).database or "postgres")


def _connect(name: str) -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to database ``name`` as the admin URL's user."""
    url = make_url(ADMIN_URL)
    return psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password,
        dbname=name,
        autocommit=True,
        connect_timeout=5,
    )


@pytest.fixture
def postgres_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh PostgreSQL database for one test; dropped afterwards. Empty, unless the test also takes
    ``database``: then it is created from a template already migrated to head, which is what
    ``database`` would have made of it (its migrations cost 1–2 s a test; a copy costs no more than an
    empty database)."""
    template = request.getfixturevalue("_postgres_template") if _wants_migrated(request) else None
    with fresh_postgres(template=template) as url:
        yield url


def _wants_migrated(request: pytest.FixtureRequest) -> bool:
    return "database" in request.fixturenames


@pytest.fixture(scope="session")
def _postgres_template() -> Iterator[str]:
    """A database migrated to head, once per test process (each xdist worker has its own)."""
    with fresh_postgres() as url:
        database = Database(url)
        migrations.upgrade(database)
        database.dispose()  # nobody may be connected to a template while it is copied
        name = make_url(url).database
        assert name is not None
        yield name


@contextmanager
def fresh_postgres(template: str | None = None) -> Iterator[str]:
    """A fresh PostgreSQL database, empty or a copy of ``template``, dropped on exit (skips or fails the
    test as above when no server answers); for fixtures of a wider scope than one test."""
    try:
        admin = _admin_connection()
    except psycopg.OperationalError as exc:
        message = HOW_TO.format(url=ADMIN_URL, error=str(exc).strip().splitlines()[0])
        if os.environ.get("EVALD_REQUIRE_POSTGRES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    kind = template or ""
    spare = _SPARE.get(kind)
    with admin:
        if spare:
            name = spare.pop()
        else:
            name = _new_name()
            admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    try:
        yield _url(name)
    finally:
        _DROPS.append(_DROPPER.submit(_recycle, name, kind))


#: Databases being recycled or dropped beside the tests that follow (see the module's docstring).
_DROPPER = ThreadPoolExecutor(max_workers=8, thread_name_prefix="evald-test-drop")
_DROPS: list[Future[None]] = []
#: Databases ready for the next test, by what they are a copy of ("" for an empty one); and the schema a new
#: one of each has (:func:`_shape`), read once from the first made.
_SPARE: dict[str, list[str]] = {}
_NEW_SHAPE: dict[str, list[tuple[str, str]]] = {}
#: How a database looks, everything a test could leave behind in it but rows: schemas, tables, columns,
#: indexes, constraints, views, functions, triggers, grants, extensions, sequences' positions, the
#: database's own settings (owner, connection limit, ...) and the migration revision.
_SHAPE = """
SELECT 'n', nspname || ':' || nspowner::regrole::text || ':' || coalesce(nspacl::text, '')
  FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
UNION ALL SELECT 'c', table_schema || '.' || table_name || '.' || column_name || ':' || data_type
  || ':' || is_nullable || ':' || coalesce(column_default, '') FROM information_schema.columns
  WHERE table_schema NOT IN ('pg_catalog', 'information_schema')
UNION ALL SELECT 'r', relnamespace::regnamespace::text || '.' || relname || ':' || relkind::text
  || ':' || coalesce(relacl::text, '') FROM pg_class
  WHERE relnamespace::regnamespace::text NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
UNION ALL SELECT 'i', indexdef FROM pg_indexes WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
UNION ALL SELECT 'k', conrelid::regclass::text || ':' || conname || ':' || pg_get_constraintdef(oid)
  FROM pg_constraint WHERE connamespace::regnamespace::text NOT IN ('pg_catalog', 'information_schema')
UNION ALL SELECT 'f', pronamespace::regnamespace::text || '.' || proname FROM pg_proc
  WHERE pronamespace::regnamespace::text NOT IN ('pg_catalog', 'information_schema')
UNION ALL SELECT 't', tgrelid::regclass::text || ':' || tgname FROM pg_trigger WHERE NOT tgisinternal
UNION ALL SELECT 'e', extname FROM pg_extension
UNION ALL SELECT 'q', schemaname || '.' || sequencename || ':' || coalesce(last_value::text, '')
  FROM pg_sequences
UNION ALL SELECT 'd', datdba::regrole::text || ':' || datconnlimit::text || ':' || datallowconn::text
  || ':' || datistemplate::text || ':' || coalesce(datacl::text, '')
  FROM pg_database WHERE datname = current_database()
UNION ALL SELECT 's', coalesce(array_to_string(setconfig, ','), '') FROM pg_db_role_setting
  WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY 1, 2
"""


def _new_name() -> str:
    return f"evald_test_{uuid.uuid4().hex[:12]}"


def _url(name: str) -> str:
    return (
        make_url(ADMIN_URL)
        .set(drivername="postgresql+psycopg", database=name)
        .render_as_string(hide_password=False)
    )


def _shape(connection: psycopg.Connection[tuple[object, ...]]) -> list[tuple[str, str]]:
    shape = [(str(kind), str(what)) for kind, what in connection.execute(_SHAPE).fetchall()]
    if connection.execute("SELECT to_regclass('alembic_version') IS NOT NULL").fetchone() == (True,):
        shape += [("a", str(row[0])) for row in connection.execute("SELECT version_num FROM alembic_version")]
    return shape


def _recycle(name: str, kind: str) -> None:
    """Give ``name`` to the next test asking for a database like it, or drop it: cut off, renamed, emptied
    and, once it has the shape of a new one, put aside (see the module's docstring)."""
    with _admin_connection() as admin:
        new = _new_name()
        for _ in range(50):
            # As DROP ... WITH (FORCE) does: what the test left connected (its pools, a daemon) is ended.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            try:
                admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{new}"')
                break
            except psycopg.errors.ObjectInUse:
                # A terminated backend not gone yet, or a client that reconnected: again, a little later.
                time.sleep(0.02)
        else:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
    try:
        with _connect(new) as connection:
            if kind == "":
                connection.execute(
                    "DO $$ DECLARE s text; BEGIN FOR s IN SELECT nspname FROM pg_namespace "
                    "WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' "
                    "LOOP EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END $$"
                )
                connection.execute("CREATE SCHEMA public AUTHORIZATION pg_database_owner")
                connection.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")
            else:
                tables = [
                    str(row[0])
                    for row in connection.execute(
                        "SELECT quote_ident(tablename) FROM pg_tables "
                        "WHERE schemaname = 'public' AND tablename <> 'alembic_version'"
                    )
                ]
                if tables:
                    connection.execute(f"TRUNCATE TABLE {', '.join(tables)} RESTART IDENTITY CASCADE")
            reusable = _shape(connection) == _reference_shape(kind)
    except psycopg.Error:
        reusable = False
    if reusable:
        _SPARE.setdefault(kind, []).append(new)
    else:
        _drop(new)


def _reference_shape(kind: str) -> list[tuple[str, str]]:
    """The shape of a database just made like ``kind`` (read once per process, from a throwaway copy)."""
    if kind not in _NEW_SHAPE:
        name = _new_name()
        with _admin_connection() as admin:
            admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{kind}"' if kind else ""))
        try:
            with _connect(name) as connection:
                _NEW_SHAPE[kind] = _shape(connection)
        finally:
            _drop(name)
    return _NEW_SHAPE[kind]


def _drop(name: str) -> None:
    with _admin_connection() as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session", autouse=True)
def _dropped_at_the_end() -> Iterator[None]:
    """The session ends once every database its tests made is dropped; one that could not be is named."""
    yield
    for future in _DROPS:
        error = future.exception()
        if error is not None:
            warnings.warn(f"a test database was not dropped: {error}", stacklevel=1)
    _DROPS.clear()
    for names in _SPARE.values():
        while names:
            _drop(names.pop())


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file in the test's folder: none yet, or, where the test takes ``database``, a copy of
    one migrated to head once per test process."""
    path = tmp_path / "evald.db"
    if _wants_migrated(request):
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def sqlite_template() -> Path:
    """A SQLite file migrated to head once per test process (:func:`tests.harness.sqlite_template`): copy
    it (``shutil.copyfile``) for a fresh, upgraded database in milliseconds instead of running every
    migration."""
    return harness.sqlite_template()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs twice: on a SQLite file and on the real PostgreSQL server."""
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """An upgraded, empty database on both backends (made from a migrated template: see ``sqlite_url``
    and ``postgres_url``; the upgrade here then finds it at head and does nothing)."""
    db = harness.upgraded(database_url)
    yield db
    db.dispose()
