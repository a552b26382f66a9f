"""Migrations never lose data: every revision down to the first and back up keeps each job, result,
sample and attempt (on SQLite, batch mode copies a table and drops the old one, which with foreign keys
on would delete every row referencing it), and a migration that would leave a dangling foreign key is
rolled back whole."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from storage import migrations, queries
from storage.database import Database
from storage.errors import StatementFailed
from storage.models import CheckpointState

TABLES = ("runs", "checkpoints", "eval_jobs", "results", "samples")


def _store_one_evaluation(database: Database) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, "toy", "/runs/toy")
        checkpoint = queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/runs/toy/step_1",
            name="step_1",
            step=1,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=1, tasks=["arith"])
        job = queries.claim_next_job(s, "test:1")
        assert job is not None
        sample = queries.SampleRow(
            index=0,
            prompt_id="arith/0",
            prompt="1+1=",
            response="2",
            extracted="2",
            reference="2",
            correct=True,
            tokens=1,
            truncated=False,
        )
        metrics = [queries.MetricRow("accuracy", 1.0, 1, 0.0)]
        assert queries.complete_job(
            s, job_id=job.id, owner="test:1", metrics=metrics, samples=[sample], duration_s=1.0, load_s=0.1
        )
        now = datetime.now(UTC)
        queries.record_attempt(
            s,
            queries.AttemptRow(
                job_id=job.id,
                attempt=1,
                engine="hf",
                tp=1,
                dp=1,
                batch_size=4,
                outcome="succeeded",
                error_kind=None,
                error=None,
                started_at=now,
                finished_at=now,
                duration_s=1.0,
            ),
        )


def _counts(database: Database, tables: tuple[str, ...] = TABLES) -> dict[str, int]:
    with database.engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() or 0) for t in tables}


def test_every_downgrade_to_the_first_revision_and_back_keeps_every_row(database: Database) -> None:
    _store_one_evaluation(database)
    stored = _counts(database, (*TABLES, "job_attempts"))
    assert set(stored.values()) == {1}, stored
    revisions = [f"{n:04d}" for n in range(int(migrations.head_revision()) - 1, 0, -1)]
    for revision in revisions:
        migrations.downgrade(database, revision)
        with database.engine.connect() as conn:
            # The revision read without alembic (storage.schema) is the one alembic reads, at each.
            assert migrations.current_revision(database) == revision
            assert MigrationContext.configure(conn).get_current_revision() == revision
        # job_attempts is 0003's: below it only the first revision's tables are left to keep.
        kept = (*TABLES, "job_attempts") if revision >= "0003" else TABLES
        assert _counts(database, kept) == {t: stored[t] for t in kept}, revision
    migrations.upgrade(database)
    assert _counts(database, TABLES) == {t: 1 for t in TABLES}
    if database.engine.dialect.name == "sqlite":
        # The connection the migrations used went back to the pool with foreign keys on again.
        with database.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_a_schema_change_leaving_a_dangling_foreign_key_is_rolled_back(sqlite_url: str) -> None:
    database = Database(sqlite_url)
    migrations.upgrade(database)
    _store_one_evaluation(database)
    dangling = pytest.raises(StatementFailed, match=r"foreign key points nowhere \(in .*eval_jobs")
    with dangling, migrations.schema_transaction(database) as conn:
        # With foreign keys off (as for a table copy), a parent row goes and its children stay.
        conn.execute(text("DELETE FROM checkpoints"))
    assert _counts(database) == {t: 1 for t in TABLES}
    database.dispose()
