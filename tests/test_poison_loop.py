"""One poisoned item never stops the main loop: its error becomes its own state, everything else goes on.

The faults are real: a trigger, created by the test in its own database, refuses the results of one
checkpoint the way a constraint would (SQLite's ``RAISE(ABORT)``, PostgreSQL's ``RAISE EXCEPTION``),
beside good checkpoints that must still be evaluated on time. The watchdog is read from a real notify
socket, as systemd would.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime
from pathlib import Path

import pytest
import structlog
from sqlalchemy import select, text

from daemon.analysis import report
from daemon.analysis.repeats import RepeatedErrors
from storage import queries
from storage.database import Database
from storage.models import CheckpointState, JobAttempt
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.deadlines import Deadline
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    evald,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)

#: The checkpoint whose results the trigger refuses.
POISONED = "step_20"
REFUSAL = f"results of {POISONED} refused by the test trigger"

SQLITE_TRIGGER = f"""
CREATE TRIGGER poison_results BEFORE INSERT ON results
WHEN (SELECT c.name FROM eval_jobs j JOIN checkpoints c ON c.id = j.checkpoint_id
      WHERE j.id = NEW.job_id) = '{POISONED}'
BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END
"""
POSTGRES_FUNCTION = f"""
CREATE FUNCTION poison_results() RETURNS trigger AS $$
BEGIN
  IF (SELECT c.name FROM eval_jobs j JOIN checkpoints c ON c.id = j.checkpoint_id
      WHERE j.id = NEW.job_id) = '{POISONED}' THEN
    RAISE EXCEPTION '{REFUSAL}';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql
"""
POSTGRES_TRIGGER = (
    "CREATE TRIGGER poison_results BEFORE INSERT ON results FOR EACH ROW EXECUTE FUNCTION poison_results()"
)


def poison_results(database: Database) -> None:
    """Make the database refuse every result row of the checkpoint named ``POISONED``."""
    with database.session() as session:
        if database.is_sqlite:
            session.execute(text(SQLITE_TRIGGER))
        else:
            session.execute(text(POSTGRES_FUNCTION))
            session.execute(text(POSTGRES_TRIGGER))


class NotifyReceiver:
    """systemd's end of ``NOTIFY_SOCKET``: every datagram with the wall-clock time it arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(path))
        self._socket.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._socket.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.time(), data.decode()))

    def pings(self, after: float = 0.0, before: float = float("inf")) -> list[float]:
        return [at for at, message in list(self.messages) if message == "WATCHDOG=1" and after <= at < before]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


@contextmanager
def notified_daemon(config: Path, log: Path, tmp: Path) -> Iterator[tuple[DaemonProcess, NotifyReceiver]]:
    receiver = NotifyReceiver(tmp / "notify.sock")
    # Pinged at most every 0.2 s: a loop that turns pings several times a second.
    env = {"NOTIFY_SOCKET": str(receiver.path), "WATCHDOG_USEC": "400000"}
    daemon = DaemonProcess(config, log, env=env)
    try:
        daemon.wait_ready()
        yield daemon, receiver
    finally:
        receiver.close()
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


def log_events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def _at(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


@pytest.mark.long
@pytest.mark.slow
def test_a_result_the_database_refuses_fails_its_job_and_every_other_checkpoint_is_evaluated(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    poison_results(database)
    data = write_dataset(tmp_path / "arith.jsonl", 8)
    config = write_config(tmp_path, database_url, dataset=data, batch_size=8)
    root = tmp_path / "run"
    log = tmp_path / "daemon.log"
    with notified_daemon(config, log, tmp_path) as (daemon, notify):
        bound = Deadline(180)
        for step in (10, 20, 30):
            copy_checkpoint(toy_run.last_checkpoint, root / f"step_{step}")
        first = wait_for(lambda: all_jobs_done(database, 3), 240, "three finished jobs", daemon.process)
        late, took = bound.expired(), bound.waited()
        # Written after the poisoned one failed: the loop still turns and takes it at once.
        copy_checkpoint(toy_run.last_checkpoint, root / "step_40")
        rows = wait_for(lambda: all_jobs_done(database, 4), 120, "the fourth job", daemon.process)
        status = evald("--config", str(config), "status")
        status_json = evald("--config", str(config), "status", "--format", "json")
        assert daemon.process.poll() is None
        stopped_at = time.time()
        assert daemon.stop() == 0
    by_step = {j.step: j for j in rows}
    assert {j.step: j.state for j in first} == {10: "succeeded", 20: "failed", 30: "succeeded"}
    # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
    assert not late, f"took {took:.1f} s"
    assert [(s, j.state, j.attempts) for s, j in sorted(by_step.items()) if s != 20] == [
        (10, "succeeded", 1),
        (30, "succeeded", 1),
        (40, "succeeded", 1),
    ]
    poisoned = by_step[20]
    assert (poisoned.state, poisoned.attempts, poisoned.error_kind) == ("failed", 1, "store_failed")
    assert poisoned.error is not None and REFUSAL in poisoned.error
    assert poisoned.error.startswith("storing its result failed: ")
    with database.session() as session:
        history = [
            (a.attempt, a.outcome, a.error_kind)
            for a in session.scalars(select(JobAttempt).where(JobAttempt.job_id == poisoned.id))
        ]
        stored = session.execute(text("SELECT count(*) FROM results WHERE job_id = :j"), {"j": poisoned.id})
        alerts = session.execute(text("SELECT rule, message FROM alerts")).all()
    assert history == [(1, "failed", "store_failed")]
    assert stored.scalar() == 0
    # Paged once (and cleared later by step 40's result).
    assert [rule for rule, _ in alerts] == ["eval_failed"]
    # The one line that names it; no pass of the loop failed, nothing was retried from memory.
    events = log_events(log)
    names = [e["event"] for e in events]
    about = [e for e in events if e.get("job_id") == poisoned.id and e.get("level") in ("error", "critical")]
    assert [(e["event"], e["kind"]) for e in about] == [("job.failed", "store_failed")]
    assert REFUSAL in str(about[0]["error"])
    assert "daemon.pass_failed" not in names and "scheduler.pass_failed" not in names
    assert names.count("job.succeeded") == 3
    assert [e.get("rule") for e in events if e["event"] == "alerts.queued"][:1] == ["eval_failed"]
    # What a person reads: the failure, its attempts of the most there may be, and the database's words.
    assert status.returncode == 0, status.stderr
    assert (
        f"failed: {POISONED} [arith] (job {poisoned.id}, 1 of 3 attempt(s)): storing its result"
        in status.stdout
    )
    (problem,) = [p for p in json.loads(status_json.stdout)["runs"]["toy"]["problems"] if "job" in p]
    assert (problem["kind"], problem["attempts"], problem["max_attempts"]) == ("store_failed", 1, 3)
    # The watchdog went on being pinged after the failure, up to the stop.
    failed_at = _at(about[0])
    assert len(notify.pings(after=failed_at, before=stopped_at)) >= 5
    database.dispose()


@pytest.mark.slow
def test_the_watchdog_is_not_pinged_while_the_loop_is_stuck(
    sqlite_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    """A loop blocked on the database (another writer holds SQLite's lock) sends no ping until it turns
    again: the ping comes from the end of a pass, not from anything that runs while the pass is stuck."""
    database = upgraded(sqlite_url)
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    config = write_config(tmp_path, sqlite_url, dataset=data)
    database_file = tmp_path / "evald.db"
    with notified_daemon(config, tmp_path / "daemon.log", tmp_path) as (daemon, notify):
        wait_for(lambda: len(notify.pings()) >= 3 or None, 30, "the first pings")
        with closing(sqlite3.connect(database_file, isolation_level=None)) as holder:
            holder.execute("BEGIN IMMEDIATE")
            held_at = time.time()
            # The next pass registers this checkpoint, and waits for the lock.
            copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
            time.sleep(6)
            released_at = time.time()
            holder.execute("ROLLBACK")
        [job] = wait_for(lambda: all_jobs_done(database, 1), 120, "the job", daemon.process)
        # Pinged again once it turns: waited for, as the job may end within a second of the release.
        wait_for(lambda: len(notify.pings(after=released_at)) >= 3 or None, 30, "pings after the release")
        assert daemon.stop() == 0
    assert job.state == "succeeded"
    during = notify.pings(after=held_at + 2, before=released_at)
    assert during == [], f"{len(during)} ping(s) while the loop was blocked"
    database.dispose()


def test_a_recurring_error_is_logged_once_with_its_traceback_then_counted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    now = [0.0]
    errors = RepeatedErrors(structlog.get_logger("test"), every_secs=60.0, clock=lambda: now[0])

    def fail(value: int) -> None:
        raise ValueError(f"bad value {value}")

    written = []
    for second in range(130):
        now[0] = float(second)
        try:
            fail(second)
        except ValueError as exc:
            written.append(errors.failed("daemon.pass_failed", exc))
    try:
        raise KeyError("other")
    except KeyError as exc:
        written.append(errors.failed("daemon.pass_failed", exc))
    out = capsys.readouterr().out
    # The first, at 60 s and at 120 s (counted), and the other error with its own traceback.
    assert written.count(True) == 4
    assert out.count("Traceback") == 2
    assert "repeated=61" in out and "repeated=121" in out


def test_a_job_being_retried_shows_its_attempts_and_last_error_in_status(database: Database) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", "/r")
        checkpoint = queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/r/step_5",
            name="step_5",
            step=5,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=5, tasks=["arith"])
    with database.session() as s:
        job = queries.claim_next_job(s, "host:1")
        assert job is not None
        queries.fail_job(
            s, job_id=job.id, owner="host:1", kind="crash", error="rank 1 died", duration_s=1.0, retry=True
        )
    with database.session() as s:
        summary = report.status(queries.checkpoint_rows(s), queries.job_rows(s), ["r"], max_attempts=3)
    (retrying,) = summary["r"]["retrying"]
    assert (retrying["job"], retrying["attempts"], retrying["max_attempts"], retrying["kind"]) == (
        job.id,
        1,
        3,
        "crash",
    )
    line = f"(job {job.id}): pending, 1 of 3 attempt(s) so far; last error crash: rank 1 died"
    assert line in report.status_text(summary)
    # Claimed again, it is still shown as retrying (the last error stays until it succeeds).
    with database.session() as s:
        again = queries.claim_next_job(s, "host:1")
        assert again is not None and again.attempts == 2
        summary = report.status(queries.checkpoint_rows(s), queries.job_rows(s), ["r"], max_attempts=3)
    assert [(r["state"], r["attempts"]) for r in summary["r"]["retrying"]] == [("running", 2)]
    with database.session() as s:
        assert queries.complete_job(
            s, job_id=job.id, owner="host:1", metrics=[], samples=[], duration_s=1.0, load_s=None, attempt=2
        )
        summary = report.status(queries.checkpoint_rows(s), queries.job_rows(s), ["r"], max_attempts=3)
    assert summary["r"]["retrying"] == [] and summary["r"]["jobs"] == {"succeeded": 1}


SQLITE_JOB_TRIGGER = f"""
CREATE TRIGGER poison_jobs BEFORE INSERT ON eval_jobs
WHEN (SELECT name FROM checkpoints WHERE id = NEW.checkpoint_id) = '{POISONED}'
BEGIN SELECT RAISE(ABORT, 'jobs of {POISONED} refused by the test trigger'); END
"""
POSTGRES_JOB_FUNCTION = f"""
CREATE FUNCTION poison_jobs() RETURNS trigger AS $$
BEGIN
  IF (SELECT name FROM checkpoints WHERE id = NEW.checkpoint_id) = '{POISONED}' THEN
    RAISE EXCEPTION 'jobs of {POISONED} refused by the test trigger';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql
"""


POSTGRES_JOB_TRIGGER = (
    "CREATE TRIGGER poison_jobs BEFORE INSERT ON eval_jobs FOR EACH ROW EXECUTE FUNCTION poison_jobs()"
)


def test_a_checkpoint_the_database_refuses_to_plan_is_skipped_naming_why_and_the_run_goes_on(
    database: Database, tmp_path: Path
) -> None:
    """Planning is one transaction per run; one checkpoint whose jobs the database refuses is undone
    alone (a savepoint), skipped with the database's words, and the checkpoints around it are planned."""
    from daemon.config import RunConfig, SchedulingConfig
    from daemon.scheduling.planner import Planner
    from daemon.watching import WatchedRun
    from storage import scheduling as store

    with database.session() as session:
        if database.is_sqlite:
            session.execute(text(SQLITE_JOB_TRIGGER))
        else:
            session.execute(text(POSTGRES_JOB_FUNCTION))
            session.execute(text(POSTGRES_JOB_TRIGGER))
        run_id = queries.ensure_run(session, "r", str(tmp_path))
    run = RunConfig(name="r", root=tmp_path)
    planner = Planner(SchedulingConfig(), database, [WatchedRun(run, run_id, ("arith",))])
    with database.session() as session:
        for step in (10, 20, 30):
            queries.record_checkpoint(
                session,
                run_id=run_id,
                path=str(tmp_path / f"step_{step}"),
                name=f"step_{step}",
                step=step,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
    assert planner.plan() == 2
    with database.session() as session:
        plans = {p.step: (p.plan, p.reason) for p in store.plan_rows(session, "r")}
        queued = sorted(j.step or 0 for j in queries.job_rows(session) if j.state == "pending")
        schedule = store.schedules(session)["r"]
    assert queued == [10, 30]
    assert plans[10][0] == plans[30][0] == "due"
    assert plans[20][0] == "skipped" and plans[20][1] is not None
    assert plans[20][1].startswith("not planned: ") and f"jobs of {POISONED} refused" in plans[20][1]
    # The counters count what was planned, not the checkpoint undone.
    assert (schedule.anchor_step, schedule.evaluated) == (30, 2)
    # Planned once: the next pass has nothing left to try again.
    assert planner.plan() == 0
