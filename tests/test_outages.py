"""The database goes away under a running daemon: it waits, comes back, and loses or doubles nothing.

PostgreSQL outages use a private server (tests/pgcluster.py) that these tests stop and start; SQLite's
are a file that cannot be written. Errors are classified against the real drivers.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError, ProgrammingError

from daemon.outage import Outage, backoff
from storage import queries
from storage.database import Database, is_outage
from storage.errors import DatabaseUnreachable
from storage.models import JobAttempt, Run
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    all_log_events,
    evald,
    jobs,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.pgcluster import PrivateCluster, private_cluster, private_database

__all__ = ["private_cluster", "private_database"]  # fixtures, used by name

#: Retries at least every half second, so that the tests wait little once the server is back.
OUTAGE_ENV = {"EVALD_DATABASE_RETRY_MAX_SECS": "0.5"}


def test_a_lost_connection_is_an_outage_and_a_bad_statement_is_not(postgres_url: str) -> None:
    database = upgraded(postgres_url)
    with pytest.raises(DatabaseUnreachable, match="terminating connection"), database.session() as s:
        s.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
    # The pool replaced the dead connection: the next transaction just works.
    with database.session() as s:
        assert s.execute(text("SELECT 1")).scalar() == 1
    with pytest.raises(ProgrammingError) as bad, database.session() as s:
        s.execute(text("SELECT * FROM no_such_table"))
    assert not is_outage(bad.value)
    with database.session() as s:
        queries.ensure_run(s, "a", "/r")
    with pytest.raises(IntegrityError) as duplicate, database.session() as s:
        s.add(Run(name="a", root="/r"))
    assert not is_outage(duplicate.value)
    refused = Database("postgresql://postgres@127.0.0.1:1/postgres")
    with pytest.raises(DatabaseUnreachable, match="refused"), refused.session() as s:
        s.execute(text("SELECT 1"))
    database.dispose()


def test_a_locked_or_full_sqlite_file_is_an_outage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    upgraded(url).dispose()
    monkeypatch.setattr("storage.database.SQLITE_BUSY_TIMEOUT_MS", 50)
    database = Database(url)
    # Another writer holds the file past the busy timeout.
    holder = sqlite3.connect(tmp_path / "evald.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(DatabaseUnreachable, match="locked"), database.session() as s:
            queries.ensure_run(s, "a", "/r")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # A file that may not grow (what a full disk does to it) refuses the write as an outage.
    with pytest.raises(DatabaseUnreachable, match="full"), database.session() as s:
        pages = s.connection().exec_driver_sql("PRAGMA page_count").scalar()
        s.connection().exec_driver_sql(f"PRAGMA max_page_count={pages}")
        for n in range(50):
            queries.ensure_run(s, f"run-{n}", "/r" * 2000)
            s.flush()
    database.dispose()


def test_one_outage_is_two_log_lines_however_many_threads_see_it(capsys: pytest.CaptureFixture[str]) -> None:
    outage = Outage(cap_secs=2.0)
    waits = []
    threads = [
        threading.Thread(target=lambda: waits.append(outage.failed(RuntimeError("gone"), where="t")))
        for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outage.active and all(0 < w <= 2.0 for w in waits)
    assert outage.succeeded() and not outage.succeeded()
    logged = capsys.readouterr().out
    assert logged.count("db.unavailable") == 1 and logged.count("db.recovered") == 1


def test_backoff_doubles_to_its_cap_and_never_waits_zero() -> None:
    rng = random.Random(1)
    ceilings = [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    for failures, ceiling in enumerate(ceilings, start=1):
        wait = backoff(failures, 5.0, rng)
        assert ceiling / 2 <= wait <= ceiling


def _all_succeeded(database: Database, count: int) -> list[queries.JobRow] | None:
    rows = jobs(database)
    return rows if len(rows) == count and all(j.state == "succeeded" for j in rows) else None


def _attempts(database: Database) -> Counter[tuple[int, str]]:
    with database.session() as session:
        return Counter((a.job_id, a.outcome) for a in session.scalars(select(JobAttempt)))


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.postgres
def test_the_daemon_lives_through_postgresql_restarts_and_stores_what_finished_meanwhile(
    private_cluster: PrivateCluster, private_database: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    data = write_dataset(tmp_path / "arith.jsonl", 16)
    database = upgraded(private_database)
    config = write_config(tmp_path, private_database, dataset=data, batch_size=4)
    root = tmp_path / "run"
    daemon = DaemonProcess(config, tmp_path / "daemon.log", env=OUTAGE_ENV)
    try:
        daemon.wait_ready()
        # 1. The server stops while a worker runs; the worker finishes; the server comes back.
        copy_checkpoint(toy_run.last_checkpoint, root / "step_10")
        wait_for(lambda: [j for j in jobs(database) if j.state == "running"] or None, 60, "a running job")
        private_cluster.stop("fast")
        result = wait_for(
            lambda: next((tmp_path / "state" / "jobs").glob("*/result.json"), None), 120, "the result file"
        )
        assert daemon.process.poll() is None
        private_cluster.start()
        wait_for(
            lambda: [j for j in jobs(database) if j.state == "succeeded"] or None, 60, "the stored result"
        )
        assert result.is_file()
        # 2. Short restarts (0.3 s down) while checkpoints keep coming.
        for step in (20, 30, 40):
            copy_checkpoint(toy_run.last_checkpoint, root / f"step_{step}")
            private_cluster.restart(down_secs=0.3)
        # 3. The idle daemon outlives a longer outage, then picks up what was written meanwhile.
        wait_for(lambda: len([j for j in jobs(database) if j.state == "succeeded"]) == 4, 180, "four jobs")
        private_cluster.stop("immediate")
        copy_checkpoint(toy_run.last_checkpoint, root / "step_50")
        with pytest.raises(subprocess.TimeoutExpired):
            daemon.process.wait(timeout=6)  # alive: it would have exited within 5 s before
        private_cluster.start()
        rows = wait_for(lambda: _all_succeeded(database, 5), 180, "all five jobs succeeded", daemon.process)
        assert daemon.stop() == 0
    finally:
        if not private_cluster.is_up():
            private_cluster.start()
        if daemon.process.poll() is None:
            daemon.process.kill()
    assert sorted(j.step or 0 for j in rows) == [10, 20, 30, 40, 50]
    assert all(j.attempts == 1 for j in rows), [(j.step, j.attempts) for j in rows]
    # Every worker run is in the history once, the one that finished offline included.
    assert _attempts(database) == Counter({(j.id, "succeeded"): 1 for j in rows})
    with database.session() as session:
        counts = Counter((r.checkpoint, r.metric) for r in queries.result_rows(session))
    assert set(counts.values()) == {1}
    events = all_log_events(tmp_path / "daemon.log")
    names = [e["event"] for e in events]
    assert names.count("db.unavailable") == names.count("db.recovered") >= 2
    assert "scheduler.pass_failed" not in names
    database.dispose()


@pytest.mark.postgres
def test_a_daemon_that_cannot_reach_the_database_at_start_gives_up_with_one_line(
    private_cluster: PrivateCluster, private_database: str, tmp_path: Path
) -> None:
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    upgraded(private_database).dispose()
    config = write_config(tmp_path, private_database, dataset=data)
    private_cluster.stop("fast")
    try:
        done = evald(
            "--config", str(config), "run", env={"EVALD_DATABASE_START_TIMEOUT_SECS": "1.5"}, timeout=60
        )
    finally:
        private_cluster.start()
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("evald:")]
    assert len(lines) == 1, done.stderr
    assert "gave up after 1.5 s" in lines[0] and "database.start_timeout_secs" in lines[0]
    assert "Connection refused" in lines[0] or "connection failed" in lines[0]


@pytest.mark.postgres
def test_a_daemon_started_before_its_database_waits_for_it(
    private_cluster: PrivateCluster, private_database: str, tmp_path: Path
) -> None:
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    upgraded(private_database).dispose()
    config = write_config(tmp_path, private_database, dataset=data)
    private_cluster.stop("fast")
    daemon = DaemonProcess(config, tmp_path / "daemon.log", env=OUTAGE_ENV)
    try:
        wait_for(lambda: b"db.unavailable" in daemon.log.read_bytes() or None, 30, "db.unavailable")
        private_cluster.start()
        daemon.wait_ready()
        assert daemon.stop() == 0
    finally:
        if not private_cluster.is_up():
            private_cluster.start()
        if daemon.process.poll() is None:
            daemon.process.kill()
    names = [e["event"] for e in all_log_events(tmp_path / "daemon.log")]
    assert names.index("db.unavailable") < names.index("db.recovered") < names.index("daemon.ready")


@pytest.mark.postgres
def test_one_outage_seen_first_by_the_relay_is_one_pair_of_lines_ended_only_once_the_server_is_back(
    private_cluster: PrivateCluster, private_database: str, tmp_path: Path
) -> None:
    """The relay thread shares the outage record: it may see the outage first, while the idle main loop
    touches no database. A pass that reached no database must not end the outage (it used to, and the
    relay's next failure started a second one): one db.unavailable, one db.recovered after the restart."""
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    upgraded(private_database).dispose()
    # Nothing is ever sent (no alert fires): the relay only polls its outbox, once a second.
    hook = '[[webhooks]]\nname = "oncall"\nurl = "http://127.0.0.1:9/hook"\n'
    config = write_config(tmp_path, private_database, dataset=data)
    config.write_text(config.read_text() + "\n" + hook)
    daemon = DaemonProcess(config, tmp_path / "daemon.log", env=OUTAGE_ENV)
    try:
        daemon.wait_ready()
        private_cluster.stop("fast")
        wait_for(lambda: b"db.unavailable" in daemon.log.read_bytes() or None, 30, "db.unavailable")
        # Long enough for many idle passes and several relay polls while the server is down.
        threading.Event().wait(5)
        back = time.time()
        private_cluster.start()
        wait_for(
            lambda: b"db.recovered" in daemon.log.read_bytes() or None, 30, "db.recovered", daemon.process
        )
        threading.Event().wait(3)  # any second outage would have started by now
        assert daemon.stop() == 0
    finally:
        if not private_cluster.is_up():
            private_cluster.start()
        if daemon.process.poll() is None:
            daemon.process.kill()
    events = all_log_events(tmp_path / "daemon.log")
    names = [e["event"] for e in events]
    assert (names.count("db.unavailable"), names.count("db.recovered")) == (1, 1)
    (recovered,) = [e for e in events if e["event"] == "db.recovered"]
    assert datetime.fromisoformat(str(recovered["timestamp"])).timestamp() >= back
