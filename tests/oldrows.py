"""Rows written into a database migrated to an older revision, for the tests of a later migration.

The ORM models (and the query layer built on them) describe the schema at head: a query through them on
an older schema names columns that later migrations add (``eval_jobs.executor_handle`` from 0011). So a
migration's test seeds its rows here, with SQL Core on the tables as the database has them now."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from storage.database import Database
from storage.models import utcnow


def insert(database: Database, table: str, **values: Any) -> int:
    """Insert one row into ``table`` as it is in ``database`` now; its ``id``."""
    with database.engine.begin() as connection:
        reflected = sa.Table(table, sa.MetaData(), autoload_with=connection)
        inserted = connection.execute(sa.insert(reflected).values(**values).returning(reflected.c.id))
        return int(inserted.scalar_one())


def finished_job(database: Database, *, run_id: int, path: str, step: int, task: str) -> int:
    """A ready checkpoint of ``run_id`` and one succeeded job of it, as the daemon would have left them;
    the job's id."""
    now = utcnow()
    checkpoint = insert(
        database,
        "checkpoints",
        run_id=run_id,
        path=path,
        name=path.rsplit("/", 1)[-1],
        step=step,
        layout="hf",
        state="ready",
        discovered_at=now,
        ready_at=now,
        updated_at=now,
    )
    return insert(
        database,
        "eval_jobs",
        checkpoint_id=checkpoint,
        task=task,
        stage="full",
        state="succeeded",
        priority=0,
        step=step,
        attempts=1,
        created_at=now,
        started_at=now,
        finished_at=now,
        duration_s=1.0,
    )
