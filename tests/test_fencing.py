"""Leases with fencing: two daemons on one PostgreSQL, an outage longer than the lease.

When the database comes back, every holder's heartbeat is older than the lease, yet both daemons are
alive. Neither may take the other's job merely because the database was away (the lease is judged on
time since it came back), and a result is stored only under the claim that holds the job (its attempt
number is the token), so nothing runs twice and no finished result is thrown away.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from storage import queries
from storage.database import Database
from storage.models import CheckpointState, JobAttempt
from storage.queries import orphans
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import DaemonProcess, all_log_events, jobs, upgraded, wait_for, write_config, write_dataset
from tests.pgcluster import PrivateCluster, private_cluster, private_database

__all__ = ["private_cluster", "private_database"]  # fixtures, used by name

LEASE_SECS = 3.0
#: Down for well over the lease: every heartbeat is stale when the server is back.
DOWN_SECS = 3 * LEASE_SECS
OUTAGE_ENV = {"EVALD_DATABASE_RETRY_MAX_SECS": "0.5"}


def _config(tmp: Path, url: str, name: str, root: Path, data: Path) -> Path:
    folder = tmp / name
    folder.mkdir()
    path = write_config(folder, url, dataset=data, batch_size=2)
    # Both daemons watch the same run root; each keeps its own state folder.
    text = path.read_text().replace(f'root = "{folder / "run"}"', f'root = "{root}"')
    text = text.replace("lease_secs = 5.0", f"lease_secs = {LEASE_SECS}\nrecover_secs = 0.5")
    path.write_text(text)
    return path


def _all_succeeded(database: Database, count: int) -> list[queries.JobRow] | None:
    rows = jobs(database)
    return rows if len(rows) == count and all(j.state == "succeeded" for j in rows) else None


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.postgres
def test_an_outage_longer_than_the_lease_runs_nothing_twice_and_throws_nothing_away(
    private_cluster: PrivateCluster, private_database: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(private_database)
    data = write_dataset(tmp_path / "arith.jsonl", 24)
    root = tmp_path / "run"
    root.mkdir()
    configs = [_config(tmp_path, private_database, name, root, data) for name in ("a", "b")]
    daemons = [DaemonProcess(c, c.parent / "daemon.log", env=OUTAGE_ENV) for c in configs]
    try:
        for daemon in daemons:
            daemon.wait_ready()
        for step in (10, 20):
            copy_checkpoint(toy_run.last_checkpoint, root / f"step_{step}")
        # Both jobs held, one by each daemon (each runs one job at a time), and beating.
        wait_for(
            lambda: len({j.claimed_by for j in jobs(database) if j.state == "running"}) == 2 or None,
            120,
            "a job running under each daemon",
        )
        private_cluster.stop("fast")
        down = time.monotonic()
        time.sleep(DOWN_SECS)
        private_cluster.start()
        assert time.monotonic() - down > LEASE_SECS
        rows = wait_for(lambda: _all_succeeded(database, 2), 240, "both jobs succeeded", daemons[0].process)
        # Several leases later still: nobody takes anything over.
        time.sleep(2 * LEASE_SECS)
        assert _all_succeeded(database, 2) is not None
        assert all(d.process.poll() is None for d in daemons)
        for daemon in daemons:
            assert daemon.stop() == 0
    finally:
        if not private_cluster.is_up():
            private_cluster.start()
        for daemon in daemons:
            if daemon.process.poll() is None:
                daemon.process.kill()
    assert [j.attempts for j in rows] == [1, 1]
    with database.session() as session:
        history = Counter((a.job_id, a.attempt, a.outcome) for a in session.scalars(select(JobAttempt)))
        metrics = Counter((r.checkpoint, r.metric) for r in queries.result_rows(session))
    # One worker run per job, stored: no duplicate run, no discarded (fenced) result.
    assert history == Counter({(j.id, 1, "succeeded"): 1 for j in rows})
    assert metrics and set(metrics.values()) == {1}
    names = [e["event"] for c in configs for e in all_log_events(c.parent / "daemon.log")]
    assert names.count("job.succeeded") == 2
    assert "job.lost_lease" not in names and "job.recovered" not in names
    assert "db.unavailable" in names
    database.dispose()


def test_a_stale_token_stores_nothing_and_the_lease_is_judged_on_the_database_clock(
    database: Database,
) -> None:
    """The fencing itself, on both backends: a claim requeued and claimed again (by the same daemon,
    even) refuses every write of the older claim."""
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", "/r")
        checkpoint = queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/r/step_1",
            name="step_1",
            step=1,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=1, tasks=["t"])
    with database.session() as s:
        first = queries.claim_next_job(s, "host:1")
        assert first is not None and first.attempts == 1
    with database.session() as s:
        # Not expired by the database's clock: a fresh heartbeat is no orphan.
        assert orphans(s, lease=timedelta(seconds=60), every_running=False) == []
        [orphan] = orphans(s, lease=timedelta(0), every_running=False)
        assert (orphan.id, orphan.attempts, orphan.claimed_by) == (first.id, 1, "host:1")
        queries.requeue_orphans(s, [orphan.id])
    with database.session() as s:
        second = queries.claim_next_job(s, "host:1")
        assert second is not None and second.attempts == 2
    metric = [queries.MetricRow("accuracy", 0.5, 4, 0.1)]
    done = {"metrics": metric, "samples": [], "duration_s": 1.0, "load_s": None}
    with database.session() as s:
        assert not queries.heartbeat(s, first.id, "host:1", attempt=1)
        assert not queries.complete_job(s, job_id=first.id, owner="host:1", attempt=1, **done)  # type: ignore[arg-type]
        assert not queries.fail_job(
            s, job_id=first.id, owner="host:1", kind="crash", error="x", duration_s=None, attempt=1
        )
        assert queries.heartbeat(s, first.id, "host:1", attempt=2)
    with database.session() as s:
        assert queries.complete_job(s, job_id=first.id, owner="host:1", attempt=2, **done)  # type: ignore[arg-type]
        assert [(r.metric, r.value) for r in queries.result_rows(s)] == [("accuracy", 0.5)]
