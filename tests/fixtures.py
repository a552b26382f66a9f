"""Fixtures for the daemon and storage tests (a pytest plugin: see ``addopts`` in pyproject.toml).

PostgreSQL tests create their own database and drop it afterwards, so runs never see each other. Where
no server answers they are skipped with a message, unless ``EVALD_REQUIRE_POSTGRES=1`` (set by .ci/run),
which turns the skip into a failure: CI never passes by skipping them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
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
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test; dropped afterwards."""
    with fresh_postgres() as url:
        yield url


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped on exit (skips or fails the test as above when no
    server answers); for fixtures of a wider scope than one test."""
    try:
        admin = _admin_connection()
    except psycopg.OperationalError as exc:
        message = HOW_TO.format(url=ADMIN_URL, error=str(exc).strip().splitlines()[0])
        if os.environ.get("EVALD_REQUIRE_POSTGRES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    name = f"evald_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield (
                make_url(ADMIN_URL)
                .set(drivername="postgresql+psycopg", database=name)
                .render_as_string(hide_password=False)
            )
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'evald.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs twice: on a SQLite file and on the real PostgreSQL server."""
    fixture = "sqlite_url" if request.param == "sqlite" else "postgres_url"
    url: str = request.getfixturevalue(fixture)
    return url


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """An upgraded, empty database on both backends."""
    db = Database(database_url)
    migrations.upgrade(db)
    yield db
    db.dispose()
