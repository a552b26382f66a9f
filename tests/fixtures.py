"""Fixtures for the daemon and storage tests (a pytest plugin: see ``addopts`` in pyproject.toml).

PostgreSQL tests create their own database and drop it afterwards, so runs never see each other. A drop
takes the server about a second (it waits for a checkpoint), and several at once take no longer than one:
the drops run on threads beside the next tests, and the session's end waits for them. Where
no server answers they are skipped with a message, unless ``EVALD_REQUIRE_POSTGRES=1`` (set by .ci/run),
which turns the skip into a failure: CI never passes by skipping them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
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

ADMIN_URL = os.environ.get("EVALD_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
HOW_TO = (
    "PostgreSQL is not reachable at {url} ({error}); start it, or point EVALD_TEST_POSTGRES_URL at a server "
    "where the user may CREATE DATABASE, to run these tests"
)


def _admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(ADMIN_URL)
    return psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password,
        dbname=url.database or "postgres",
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
    name = f"evald_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    try:
        yield (
            make_url(ADMIN_URL)
            .set(drivername="postgresql+psycopg", database=name)
            .render_as_string(hide_password=False)
        )
    finally:
        _DROPS.append(_DROPPER.submit(_drop, name))


#: Databases being dropped beside the tests that follow (see the module's docstring).
_DROPPER = ThreadPoolExecutor(max_workers=8, thread_name_prefix="evald-test-drop")
_DROPS: list[Future[None]] = []


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


@pytest.fixture
def sqlite_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file in the test's folder: none yet, or, where the test takes ``database``, a copy of
    one migrated to head once per test process."""
    path = tmp_path / "evald.db"
    if _wants_migrated(request):
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per test process: copy it (``shutil.copyfile``) for a fresh,
    upgraded database in milliseconds instead of running every migration."""
    path = tmp_path_factory.mktemp("sqlite-template") / "evald.db"
    database = Database(f"sqlite:///{path}")
    migrations.upgrade(database)
    database.dispose()
    # Everything into the main file, so that copying it alone copies the whole database.
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


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
    db = Database(database_url)
    migrations.upgrade(db)
    yield db
    db.dispose()
