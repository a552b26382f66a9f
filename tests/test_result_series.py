"""``result_series``: the (run, task, stage) keys ``complete_job`` writes beside each job's results, from
which "latest of every run" and each run's newest evaluated step start instead of scanning every job.

Checked against the answer of a plain scan of every job and result (what the queries computed before the
table), on a queue with failed, pending and requeued jobs, two checkpoint folders at one step and a
checkpoint without a step; after the migration that fills the table from the jobs already stored; and
with several daemons completing jobs of one series at the same moment.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import migrations, queries
from storage.database import Database
from storage.models import (
    Checkpoint,
    CheckpointState,
    EvalJob,
    JobState,
    Result,
    ResultSeries,
    Run,
    UTCDateTime,
)


def _checkpoint(s: Session, run: str, step: int | None, folder: str | None = None) -> int:
    run_id = queries.ensure_run(s, run, f"/runs/{run}")
    name = folder or f"step_{step}"
    return queries.record_checkpoint(
        s,
        run_id=run_id,
        path=f"/runs/{run}/{name}",
        name=name,
        step=step,
        epoch=None,
        layout="hf",
        state=CheckpointState.READY,
    )


def _metrics(step: int | None, task: str, stage: str) -> list[queries.MetricRow]:
    base = (step or 0) / 1000 + len(task) / 100 + (0.5 if stage == "quick" else 0)
    return [
        queries.MetricRow("accuracy", base, 10, 0.1),
        queries.MetricRow(f"{task}_only", base + 1, 10, None),
    ]


def _work_through(db: Database, outcome: dict[tuple[str, int | None, str, str], str]) -> None:
    """Claim every pending job and complete it, fail it, or (``leave``) hand it back to the queue at the
    end, as a daemon stopping does; by default complete it."""
    left: list[int] = []
    while True:
        with db.session() as s:
            job = queries.claim_next_job(s, "host:1")
        if job is None:
            break
        what = outcome.get((job.run, job.step, job.task, job.stage), "done")
        with db.session() as s:
            if what == "done":
                assert queries.complete_job(
                    s,
                    job_id=job.id,
                    owner="host:1",
                    metrics=_metrics(job.step, job.task, job.stage),
                    samples=[],
                    duration_s=1.0,
                    load_s=None,
                )
            elif what == "fail":
                assert queries.fail_job(s, job_id=job.id, owner="host:1", kind="x", error="x", duration_s=1.0)
            else:
                left.append(job.id)
    for job_id in left:
        with db.session() as s:
            assert queries.requeue_job(s, job_id=job_id, owner="host:1")


def _queue(db: Database) -> None:
    with db.session() as s:
        for run in ("a", "b"):
            for step in (10, 20, 30):
                checkpoint = _checkpoint(s, run, step)
                queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=["math", "code"])
                queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=["math"], stage="quick")
        # Two folders at one step of run a: both evaluated, the newer job's value wins.
        twin = _checkpoint(s, "a", 30, folder="step_30_copy")
        queries.enqueue_jobs(s, checkpoint_id=twin, step=30, tasks=["math"])
        # A checkpoint without a step is never on a curve.
        stepless = _checkpoint(s, "b", None, folder="final")
        queries.enqueue_jobs(s, checkpoint_id=stepless, step=None, tasks=["math"])
        # A run whose only job fails has no series; a run with no jobs has none either.
        failing = _checkpoint(s, "c", 10)
        queries.enqueue_jobs(s, checkpoint_id=failing, step=10, tasks=["math"])
        _checkpoint(s, "d", 10)
    # Run b's newest code job fails, so its code series ends at step 20.
    _work_through(db, {("b", 30, "code", "full"): "fail", ("c", 10, "math", "full"): "fail"})


def _scanned_latest(s: Session, run: str | None = None) -> list[queries.ResultRow]:
    """The answer by brute force: every result of every succeeded job, the newest step of each
    (run, task, stage), and at that step each metric's value from the newest job."""
    rows = s.execute(
        select(
            Run.name,
            Checkpoint.name,
            Checkpoint.step,
            Checkpoint.epoch,
            EvalJob.task,
            EvalJob.stage,
            Result.metric,
            Result.value,
            Result.n,
            Result.stderr,
            EvalJob.finished_at,
            EvalJob.id,
        )
        .join(EvalJob, Result.job_id == EvalJob.id)
        .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .where(EvalJob.state == JobState.SUCCEEDED, Checkpoint.step.is_not(None))
    ).all()
    found = [(job_id, queries.ResultRow(*row)) for *row, job_id in rows]
    newest: dict[tuple[str, str, str], int] = {}
    for _, r in found:
        assert r.step is not None
        newest[(r.run, r.task, r.stage)] = max(newest.get((r.run, r.task, r.stage), r.step), r.step)
    chosen: dict[tuple[str, str, str, str], tuple[int, queries.ResultRow]] = {}
    for job_id, r in found:
        if r.step != newest[(r.run, r.task, r.stage)] or (run is not None and r.run != run):
            continue
        if _key(r) not in chosen or job_id > chosen[_key(r)][0]:
            chosen[_key(r)] = (job_id, r)
    return [row for _, row in chosen.values()]


def _sorted(rows: list[queries.ResultRow]) -> list[queries.ResultRow]:
    return sorted(rows, key=lambda r: (r.run, r.task, r.stage, r.metric))


def _scanned_evaluated_step(s: Session) -> dict[str, int | None]:
    steps: dict[str, int | None] = {name: None for name in s.scalars(select(Run.name))}
    query = (
        select(Run.name, sa.func.max(Checkpoint.step))
        .join(Checkpoint, Checkpoint.run_id == Run.id)
        .join(EvalJob, EvalJob.checkpoint_id == Checkpoint.id)
        .where(EvalJob.state == JobState.SUCCEEDED)
        .group_by(Run.name)
    )
    steps.update({name: step for name, step in s.execute(query)})
    return steps


def _key(row: queries.ResultRow) -> tuple[str, str, str, str]:
    return (row.run, row.task, row.stage, row.metric)


def test_latest_results_match_a_scan_of_every_job(database: Database) -> None:
    _queue(database)
    with database.session() as s:
        latest = queries.latest_results(s)
        scanned = _scanned_latest(s)
        assert _sorted(latest) == sorted(scanned, key=_key)
        for run in ("a", "b", "c", "d"):
            assert _sorted(queries.latest_results(s, run=run)) == sorted(_scanned_latest(s, run), key=_key)
        assert {r.name: r.evaluated_step for r in queries.run_rows(s)} == _scanned_evaluated_step(s)
        series = {
            tuple(r) for r in s.execute(select(Run.name, ResultSeries.task, ResultSeries.stage).join(Run))
        }
    # The cases the queue holds came out as meant.
    by_key = {_key(r): r for r in latest}
    assert by_key[("a", "math", "full", "accuracy")].checkpoint == "step_30_copy"
    assert by_key[("b", "code", "full", "accuracy")].step == 20
    assert by_key[("b", "math", "full", "accuracy")].step == 30
    assert not any(r.run in ("c", "d") for r in latest)
    assert series == {
        (r, t, st) for r in ("a", "b") for t, st in (("math", "full"), ("code", "full"), ("math", "quick"))
    }


def test_a_later_success_moves_the_latest_and_a_requeued_job_is_no_result(database: Database) -> None:
    _queue(database)
    with database.session() as s:
        checkpoint = _checkpoint(s, "b", 40)
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=40, tasks=["math", "code"])
    # Step 40's math job succeeds; its code job is handed back to the queue (pending again).
    _work_through(database, {("b", 40, "code", "full"): "leave"})
    with database.session() as s:
        latest = {_key(r): r.step for r in queries.latest_results(s, run="b")}
        assert _sorted(queries.latest_results(s)) == sorted(_scanned_latest(s), key=_key)
    assert latest[("b", "math", "full", "accuracy")] == 40
    assert latest[("b", "code", "full", "accuracy")] == 20


def test_the_migration_fills_the_series_of_jobs_stored_before_it(database_url: str) -> None:
    """A database at 0006 with results stored by an older evald: the upgrade writes their series, and
    the latest results and evaluated steps read from it are those of a scan."""
    db = Database(database_url)
    migrations.upgrade(db, "0006")
    t0 = datetime(2026, 11, 1, tzinfo=UTC)

    def table(name: str, *columns: str, times: tuple[str, ...] = ("created_at",)) -> sa.TableClause:
        return sa.table(name, *(sa.column(c) for c in columns), *(sa.column(c, UTCDateTime()) for c in times))

    runs = table("runs", "id", "name", "root")
    checkpoints = table(
        "checkpoints",
        *("id", "run_id", "path", "name", "step", "layout", "state"),
        times=("discovered_at", "updated_at"),
    )
    jobs = table(
        "eval_jobs",
        *("id", "checkpoint_id", "task", "stage", "state", "priority", "step", "attempts"),
        times=("created_at", "finished_at"),
    )
    results = table("results", "id", "job_id", "metric", "value")
    job_id = 0
    with db.session() as s:
        for run_id, run in ((1, "old"), (2, "failed_only")):
            s.execute(sa.insert(runs).values(id=run_id, name=run, root=f"/runs/{run}", created_at=t0))
        for checkpoint_id, (run_id, step) in enumerate([(1, 10), (1, 20), (2, 10)], start=1):
            s.execute(
                sa.insert(checkpoints).values(
                    id=checkpoint_id,
                    run_id=run_id,
                    path=f"/runs/{run_id}/step_{step}",
                    name=f"step_{step}",
                    step=step,
                    layout="hf",
                    state="ready",
                    discovered_at=t0,
                    updated_at=t0,
                )
            )
            for task, state in (("math", "succeeded"), ("code", "succeeded" if step == 10 else "failed")):
                job_id += 1
                if run_id == 2:
                    state = "failed"
                s.execute(
                    sa.insert(jobs).values(
                        id=job_id,
                        checkpoint_id=checkpoint_id,
                        task=task,
                        stage="full",
                        state=state,
                        priority=0,
                        step=step,
                        attempts=1,
                        created_at=t0,
                        finished_at=t0,
                    )
                )
                if state == "succeeded":
                    s.execute(
                        sa.insert(results).values(
                            id=job_id, job_id=job_id, metric="accuracy", value=step / 100, created_at=t0
                        )
                    )
    migrations.upgrade(db)
    try:
        with db.session() as s:
            keys = select(Run.name, ResultSeries.task, ResultSeries.stage).join(Run)
            series = {tuple(r) for r in s.execute(keys)}
            latest = queries.latest_results(s)
            assert _sorted(latest) == sorted(_scanned_latest(s), key=_key)
            assert {r.name: r.evaluated_step for r in queries.run_rows(s)} == {"old": 20, "failed_only": None}
        assert series == {("old", "math", "full"), ("old", "code", "full")}
        assert {(r.task, r.step) for r in latest} == {("math", 20), ("code", 10)}
    finally:
        db.dispose()


def test_daemons_completing_jobs_of_one_series_at_once_write_its_key_once(database: Database) -> None:
    """Two daemons (their own engines) store results of one (run, task, stage) in overlapping
    transactions: the second insert of the key waits for the first, then does nothing; both commit."""
    with database.session() as s:
        for step in (10, 20):
            checkpoint = _checkpoint(s, "shared", step)
            queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=["math"])
    other = Database(database.url)
    claimed = []
    for db, owner in ((database, "host:1"), (other, "host:2")):
        with db.session() as s:
            job = queries.claim_next_job(s, owner)
        assert job is not None
        claimed.append((db, owner, job))
    first_stored = threading.Event()
    outcomes: dict[str, bool] = {}
    errors: list[BaseException] = []

    def complete(db: Database, owner: str, job: queries.ClaimedJob, hold: bool) -> None:
        try:
            with db.session() as s:
                done = queries.complete_job(
                    s,
                    job_id=job.id,
                    owner=owner,
                    metrics=_metrics(job.step, job.task, job.stage),
                    samples=[],
                    duration_s=1.0,
                    load_s=None,
                )
                if hold:
                    first_stored.set()
                    time.sleep(0.5)  # the other daemon's insert of the same key runs meanwhile
            outcomes[owner] = done
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=complete, args=(*claimed[0], True)),
        threading.Thread(target=complete, args=(*claimed[1], False)),
    ]
    threads[0].start()
    assert first_stored.wait(timeout=30)
    threads[1].start()
    for t in threads:
        t.join(timeout=60)
    other.dispose()
    assert errors == [] and outcomes == {"host:1": True, "host:2": True}
    with database.session() as s:
        keys = [tuple(r) for r in s.execute(select(ResultSeries.task, ResultSeries.stage))]
        assert keys == [("math", "full")]
        assert [(r.step, r.metric) for r in queries.latest_results(s)] == [
            (20, "accuracy"),
            (20, "math_only"),
        ]
        assert _sorted(queries.latest_results(s)) == sorted(_scanned_latest(s), key=_key)
