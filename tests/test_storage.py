"""Storage rules on both backends: the same tests against SQLite and the real PostgreSQL server."""

from __future__ import annotations

import math
import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from storage import migrations, queries, scheduling, schema
from storage.database import Database
from storage.errors import DatabaseUnreachable, InstanceLocked, SchemaOutdated
from storage.models import Base, CheckpointState, EvalJob, JobState, Result, UTCDateTime


def _ready_checkpoint(db: Database, step: int = 10, tasks: tuple[str, ...] = ("arith",)) -> int:
    with db.session() as s:
        run_id = queries.ensure_run(s, "r1", "/runs/r1")
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/runs/r1/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=tasks)
    return checkpoint_id


METRICS = [queries.MetricRow("accuracy", 0.5, 10, 0.16), queries.MetricRow("wall_s", 1.5, None, None)]


def test_upgrade_creates_schema_and_is_idempotent(database: Database) -> None:
    assert migrations.current_revision(database) == migrations.head_revision()
    migrations.require_current(database)
    before, after = migrations.upgrade(database)
    assert before == after == migrations.head_revision()


def test_migrations_build_exactly_the_models_schema(database: Database) -> None:
    """A migration that forgets a column, an index or a foreign key the models declare (or the reverse)
    would only show on the production database: compare the upgraded schema with the models."""
    with database.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_upgrade_from_0001_starts_the_counters_after_what_was_evaluated(database_url: str) -> None:
    """A database from before scheduling: its ready checkpoints count as due, and each run's counters
    start from the newest of them, so the first new checkpoint is judged against it, not against step 0."""
    db = Database(database_url)
    migrations.upgrade(db, "0001")
    runs = sa.table(
        "runs", sa.column("id"), sa.column("name"), sa.column("root"), sa.column("created_at", UTCDateTime())
    )
    columns = ("id", "run_id", "path", "name", "step", "epoch", "layout", "state")
    checkpoints = sa.table(
        "checkpoints",
        *(sa.column(c) for c in columns),
        *(sa.column(c, UTCDateTime()) for c in ("discovered_at", "ready_at", "updated_at")),
    )
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    with db.session() as s:
        s.execute(sa.insert(runs).values(id=1, name="old", root="/runs/old", created_at=t0))
        s.execute(sa.insert(runs).values(id=2, name="empty", root="/runs/empty", created_at=t0))
        for i, (step, state) in enumerate([(100, "ready"), (200, "ready"), (300, "discovered")], start=1):
            at = t0 + timedelta(hours=i)
            s.execute(
                sa.insert(checkpoints).values(
                    id=i,
                    run_id=1,
                    path=f"/runs/old/step_{step}",
                    name=f"step_{step}",
                    step=step,
                    epoch=None,
                    layout="hf",
                    state=state,
                    discovered_at=at,
                    ready_at=at if state == "ready" else None,
                    updated_at=at,
                )
            )
    migrations.upgrade(db)
    with db.session() as s:
        schedules = scheduling.schedules(s)
        plans = {p.step: p.plan for p in scheduling.plan_rows(s)}
    assert (schedules["old"].anchor_step, schedules["old"].evaluated) == (200, 2)
    assert schedules["old"].anchor_at == t0 + timedelta(hours=2)
    assert (schedules["empty"].anchor_step, schedules["empty"].evaluated) == (0, 0)
    assert plans == {100: "due", 200: "due"}
    db.dispose()


def test_old_schema_is_refused_with_the_fix(database_url: str) -> None:
    db = Database(database_url)
    try:
        with pytest.raises(SchemaOutdated, match="run `evald db upgrade`"):
            migrations.require_current(db)
    finally:
        db.dispose()


def test_the_head_revision_this_code_needs_is_alembics_head() -> None:
    """:mod:`storage.schema` knows the newest revision without reading the migration files (every command
    asks it): a migration added without moving :data:`storage.schema.HEAD_REVISION` fails here."""
    assert migrations.head_revision() == schema.HEAD_REVISION


def _alembic_revision(db: Database) -> str | None:
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def test_the_revision_is_read_from_the_database_as_alembic_reads_it(database_url: str) -> None:
    db = Database(database_url)
    try:
        assert schema.current_revision(db) is None and _alembic_revision(db) is None
        migrations.upgrade(db)
        assert schema.current_revision(db) == _alembic_revision(db) == schema.HEAD_REVISION
        schema.require_current(db)
        # A revision this code does not know (a newer evald's) is refused as an older one is.
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        assert schema.current_revision(db) == _alembic_revision(db) == "9999"
        needs = f"has schema revision 9999, this evald needs {schema.HEAD_REVISION}: run `evald db upgrade`"
        with pytest.raises(SchemaOutdated, match=needs):
            schema.require_current(db)
        # Two rows: a branched history evald never makes (alembic refuses it too).
        with db.engine.begin() as conn:
            conn.execute(text("INSERT INTO alembic_version (version_num) VALUES ('0001')"))
        with pytest.raises(SchemaOutdated, match=r"several schema revisions \(0001, 9999\)"):
            schema.require_current(db)
        # An empty version table is an unmigrated database, as alembic reads it.
        with db.engine.begin() as conn:
            conn.execute(text("DELETE FROM alembic_version"))
        assert schema.current_revision(db) is None and _alembic_revision(db) is None
        with pytest.raises(SchemaOutdated, match="has no evald schema"):
            schema.require_current(db)
    finally:
        db.dispose()


def test_one_job_per_checkpoint_task_stage(database: Database) -> None:
    checkpoint_id = _ready_checkpoint(database, tasks=("a", "b"))
    with database.session() as s:
        # Discovering the same checkpoint again adds nothing.
        assert queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=10, tasks=("a", "b", "c")) == 1
    with pytest.raises(IntegrityError), database.session() as s:
        s.add(EvalJob(checkpoint_id=checkpoint_id, task="a", stage="full", step=10))
        s.flush()
    with database.session() as s:
        assert sorted(j.task for j in queries.job_rows(s)) == ["a", "b", "c"]


def test_claim_complete_stores_everything_in_one_transaction(database: Database) -> None:
    _ready_checkpoint(database)
    with database.session() as s:
        job = queries.claim_next_job(s, "host:1")
    assert job is not None and job.attempts == 1 and job.step == 10
    with database.session() as s:
        assert queries.claim_next_job(s, "host:2") is None
    sample = queries.SampleRow(0, "0", "1+1=", "\\boxed{2}", "2", "2", True, 9, False)
    with database.session() as s:
        assert queries.complete_job(
            s, job_id=job.id, owner="host:1", metrics=METRICS, samples=[sample], duration_s=2.0, load_s=0.5
        )
    with database.session() as s:
        rows = queries.result_rows(s)
        assert [(r.metric, r.value, r.n) for r in rows] == [("accuracy", 0.5, 10), ("wall_s", 1.5, None)]
        assert queries.job_state(s, job.id) is JobState.SUCCEEDED
        # A second completion (a stale worker) is refused, and the unique constraint backs that up.
        assert not queries.complete_job(
            s, job_id=job.id, owner="host:1", metrics=METRICS, samples=[], duration_s=1.0, load_s=None
        )
    with pytest.raises(IntegrityError), database.session() as s:
        s.add(Result(job_id=job.id, metric="accuracy", value=1.0))
        s.flush()


def test_failed_completion_rolls_back_results(database: Database) -> None:
    _ready_checkpoint(database)
    with database.session() as s:
        job = queries.claim_next_job(s, "host:1")
    assert job is not None
    duplicate = [queries.MetricRow("accuracy", 0.5, 10, None), queries.MetricRow("accuracy", 0.6, 10, None)]
    with pytest.raises(IntegrityError), database.session() as s:
        queries.complete_job(
            s, job_id=job.id, owner="host:1", metrics=duplicate, samples=[], duration_s=1, load_s=None
        )
    with database.session() as s:
        assert queries.result_rows(s) == []
        assert queries.job_state(s, job.id) is JobState.RUNNING


def test_orphaned_running_job_is_requeued_once(database: Database) -> None:
    _ready_checkpoint(database)
    with database.session() as s:
        job = queries.claim_next_job(s, "dead:1")
    assert job is not None
    with database.session() as s:
        # Fresh heartbeat: on a shared queue it is still somebody's.
        assert queries.recover_orphans(s, lease=timedelta(minutes=5), every_running=False) == []
        assert queries.recover_orphans(s, lease=timedelta(seconds=0), every_running=False) == [job.id]
    with database.session() as s:
        again = queries.claim_next_job(s, "new:2")
    assert again is not None and again.id == job.id and again.attempts == 2
    with database.session() as s:
        # The dead owner's late result is not stored: the job is no longer its.
        assert not queries.complete_job(
            s, job_id=job.id, owner="dead:1", metrics=METRICS, samples=[], duration_s=1, load_s=None
        )
        assert queries.complete_job(
            s, job_id=job.id, owner="new:2", metrics=METRICS, samples=[], duration_s=1, load_s=None
        )
    with database.session() as s:
        assert len(queries.result_rows(s)) == len(METRICS)


def test_requeue_on_shutdown_does_not_count_an_attempt(database: Database) -> None:
    _ready_checkpoint(database)
    with database.session() as s:
        job = queries.claim_next_job(s, "host:1")
    assert job is not None
    with database.session() as s:
        assert queries.requeue_job(s, job_id=job.id, owner="host:1")
    with database.session() as s:
        again = queries.claim_next_job(s, "host:1")
    assert again is not None and again.attempts == 1


def test_queue_takes_newest_step_first(database: Database) -> None:
    for step in (10, 30, 20):
        _ready_checkpoint(database, step=step)
    claimed = []
    for _ in range(3):
        with database.session() as s:
            job = queries.claim_next_job(s, "host:1")
        assert job is not None
        claimed.append(job.step)
    assert claimed == [30, 20, 10]


def test_concurrent_claims_never_take_one_job_twice(database: Database) -> None:
    for step in range(1, 9):
        _ready_checkpoint(database, step=step)
    taken: list[int] = []
    lock = threading.Lock()

    def claimer(owner: str) -> None:
        while True:
            with database.session() as s:
                job = queries.claim_next_job(s, owner)
            if job is None:
                return
            with lock:
                taken.append(job.id)

    threads = [threading.Thread(target=claimer, args=(f"h:{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == sorted(set(taken)) and len(taken) == 8


def test_sqlite_runs_in_wal_mode_with_a_busy_timeout(sqlite_url: str) -> None:
    db = Database(sqlite_url)
    try:
        with db.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 10_000
    finally:
        db.dispose()


def test_one_daemon_per_sqlite_file(sqlite_url: str) -> None:
    first, second = Database(sqlite_url), Database(sqlite_url)
    try:
        first.lock_instance()
        with pytest.raises(InstanceLocked, match="use PostgreSQL"):
            second.lock_instance()
    finally:
        first.dispose()
        second.dispose()


def test_unreachable_postgres_is_one_clear_error() -> None:
    db = Database("postgresql://nobody@127.0.0.1:1/evald")
    try:
        with pytest.raises(
            DatabaseUnreachable, match=r"cannot reach database postgresql\+psycopg://nobody@127.0.0.1:1"
        ):
            db.check_reachable()
    finally:
        db.dispose()


def test_missing_sqlite_folder_is_named(tmp_path: object) -> None:
    with pytest.raises(DatabaseUnreachable, match="does not exist"):
        Database("sqlite:////nonexistent-folder-evald/x.db")


def test_timestamps_come_back_aware_in_utc(database: Database) -> None:
    _ready_checkpoint(database)
    with database.session() as s:
        job = queries.claim_next_job(s, "host:1")
    assert job is not None
    with database.session() as s:
        started = s.get(EvalJob, job.id).started_at  # type: ignore[union-attr]
    assert started is not None and started.utcoffset() == timedelta(0)


def test_a_nan_or_infinite_metric_is_stored_and_read_back(database: Database) -> None:
    _ready_checkpoint(database)
    with database.session() as s:
        job = queries.claim_next_job(s, "host:1")
    assert job is not None
    metrics = [
        queries.MetricRow("perplexity", float("nan"), 29, None),
        queries.MetricRow("nll", float("inf"), 29, None),
        queries.MetricRow("wall_s", 1.5, None, None),
    ]
    with database.session() as s:
        assert queries.complete_job(
            s, job_id=job.id, owner="host:1", metrics=metrics, samples=[], duration_s=1.0, load_s=None
        )
    with database.session() as s:
        values = {r.metric: r.value for r in queries.result_rows(s)}
    assert math.isnan(values["perplexity"])
    assert values["nll"] == math.inf
    assert values["wall_s"] == 1.5
