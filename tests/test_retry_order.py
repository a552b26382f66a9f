"""A checkpoint that failed an attempt never runs ahead of a fresh one (issue 41), on SQLite and PostgreSQL.

Six checkpoints numbered above two good ones each failed an attempt (a crash, back in the queue to be
retried): the claims take the fresh ones first, newest first among them as the backlog policy says, and
the retries after, in the same order. The same holds for the executor's ``priority = "newest"`` order and
across runs: a run with only retries waits for a run with a fresh job.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from storage import queries
from storage.database import Database
from storage.models import CheckpointState, EvalJob, JobState

BAD = (101, 102, 103, 104, 105, 106)
GOOD = (10, 20)


def _checkpoint(session: Session, run: str, step: int) -> int:
    """A ready checkpoint of ``run`` at ``step`` with one pending job; returns the job's id."""
    run_id = queries.ensure_run(session, run, f"/runs/{run}")
    checkpoint_id = queries.record_checkpoint(
        session,
        run_id=run_id,
        path=f"/runs/{run}/step_{step}",
        name=f"step_{step}",
        step=step,
        epoch=None,
        layout="hf",
        state=CheckpointState.READY,
    )
    queries.enqueue_jobs(session, checkpoint_id=checkpoint_id, step=step, tasks=("arith",))
    return next(j.id for j in queries.job_rows(session, run) if j.step == step)


def _failed_once(session: Session, job_id: int) -> None:
    """Where the daemon leaves a job whose attempt crashed and is to be retried."""
    session.execute(
        update(EvalJob)
        .where(EvalJob.id == job_id)
        .values(state=JobState.PENDING, attempts=1, error_kind="crash", error="worker killed by SIGKILL")
    )


def _claims(database: Database, **order: bool) -> list[tuple[str, int | None]]:
    taken: list[tuple[str, int | None]] = []
    while True:
        with database.session() as session:
            job = queries.claim_next_job(session, "host:1", newest_first=order.get("newest_first", False))
        if job is None:
            return taken
        taken.append((job.run, job.step))


def _backlog(database: Database, run: str = "toy") -> None:
    """The bad checkpoints became ready last (the newest of all), each failed once; the good ones fresh."""
    with database.session() as session:
        for step in GOOD:
            _checkpoint(session, run, step)
        for step in BAD:
            _failed_once(session, _checkpoint(session, run, step))


def test_retries_wait_behind_fresh_checkpoints_newest_first(database: Database) -> None:
    _backlog(database)
    assert _claims(database) == [("toy", s) for s in (20, 10, 106, 105, 104, 103, 102, 101)]


def test_retries_wait_behind_fresh_checkpoints_in_the_newest_ready_order(database: Database) -> None:
    _backlog(database)
    steps = [step or 0 for _, step in _claims(database, newest_first=True)]
    assert steps[:2] == [20, 10] and sorted(steps[2:]) == list(BAD)


def test_a_run_with_only_retries_waits_for_a_run_with_a_fresh_job(database: Database) -> None:
    with database.session() as session:
        _failed_once(session, _checkpoint(session, "bad", 500))
        _checkpoint(session, "good", 5)
    assert _claims(database) == [("good", 5), ("bad", 500)]
