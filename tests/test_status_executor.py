"""What ``evald status`` (text and JSON) and ``/api/v1/status`` say while the executor's controller does not
answer (issue 45): the controller unreachable since when, as the daemon that saw it, claiming paused; each
job handed to it in an UNKNOWN state since when with its last known state, not RUNNING; and nothing of the
kind once a daemon said it answers again. On SQLite and PostgreSQL, from rows stored through the
functions the daemon stores them with (:mod:`daemon.running.outages`, ``set_executor_state``).

The daemon's side, with a real Ray cluster and a head cut off from the daemon, is
tests/test_ray_daemon.py's."""

from __future__ import annotations

import json
import string
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import TestClient

from daemon.analysis.report.status_summary import scheduler_phase, unknown_since
from daemon.cli import main
from daemon.config import load_config
from daemon.running import outages, remote
from daemon.running.executors.base import Handle
from daemon.running.outages import Outage
from daemon.web.server import build
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.harness import write_config, write_dataset

OWNER = "head-host:4242"
WHAT = "the Ray head at http://127.0.0.1:8265"


def _ray_config(tmp_path: Path, url: str) -> Path:
    config = write_config(tmp_path, url, dataset=write_dataset(tmp_path / "d.jsonl", 2))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    with config.open("a") as extra:
        extra.write(
            f'\n[executor]\nkind = "ray"\njob_dir = "{jobs}"\n\n[executor.ray]\naddress = "http://127.0.0.1:8265"\n'
        )
    return config


def _running_ray_job(database: Database, step: int) -> int:
    """A job claimed by ``OWNER`` and submitted to Ray, its handle stored as the dispatcher stores it."""
    with database.session() as s:
        run_id = queries.ensure_run(s, "toy", "/toy")
        checkpoint = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/toy/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=["arith"])
    with database.session() as s:
        job = queries.claim_next_job(s, OWNER)
        assert job is not None
    handle = Handle("ray", job.id, 1, Path(f"/jobs/{job.id}-1"), f"evald-{job.id}-1")
    with database.session() as s:
        assert queries.record_handle(s, job_id=job.id, owner=OWNER, attempt=1, handle=handle.to_json())
    return job.id


def _set_state(database: Database, job: int, state: str) -> None:
    with database.session() as s:
        assert queries.set_executor_state(s, job_id=job, owner=OWNER, attempt=1, state=state)


def _status(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["--config", str(config), "status", *extra]) == 0
    return capsys.readouterr().out


def test_a_head_that_does_not_answer_shows_unreachable_since_when_and_its_jobs_unknown_not_running(
    database: Database, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _ray_config(tmp_path, database_url)
    job = _running_ray_job(database, 10)
    running = "RUNNING on a (192.0.2.2)"
    _set_state(database, job, running)
    # Before any daemon said a word of the head: nothing about it, the job as Ray last said it.
    text = _status(config, capsys)
    assert "executor:" not in text and "  jobs:        running 1" in text
    assert f"ray:       job evald-{job}-1: {running}" in text

    since = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=125)
    error = "Ray's dashboard at http://127.0.0.1:8265 does not answer (job info): ConnectionError: refused"
    outages.record(database, [Outage(False, since, WHAT, "ray", error)], OWNER)
    _set_state(database, job, remote.unknown_line(since, WHAT, running))

    text = _status(config, capsys)
    stamp = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    (head,) = [line for line in text.splitlines() if line.startswith("executor:")]
    assert head.startswith(f"executor: unreachable since {stamp} (2m ")
    assert (
        f"): {WHAT} does not answer (as daemon {OWNER} saw it); claiming paused; the states of the jobs "
        f"handed to it are unknown until it answers; it said: {error}"
    ) in head
    # The job is neither running nor pending: unknown, since when, and what Ray last said of it.
    assert "  jobs:        state unknown 1 (Ray does not answer), running 0" in text, text
    (line,) = [line for line in text.splitlines() if f"(job {job})" in line]
    assert line.startswith(
        f"  unknown:     step 10 [arith/full] (job {job}): Ray job evald-{job}-1 state unknown since "
        f"{stamp} (2m "
    )
    assert line.endswith(f"): {WHAT} does not answer; last {running}; attempt 1 of 3, submitted by {OWNER}")
    assert "  running:" not in text

    shown = json.loads(_status(config, capsys, "--format", "json"))
    executor = shown["executor"]
    assert {k: executor[k] for k in ("kind", "reachable", "what", "error", "daemon", "claiming")} == {
        "kind": "ray",
        "reachable": False,
        "what": WHAT,
        "error": error,
        "daemon": OWNER,
        "claiming": "paused",
    }
    assert datetime.fromisoformat(executor["since"]) == since and executor["away_s"] >= 125
    (job_shown,) = shown["runs"]["toy"]["running"]
    assert (job_shown["in_slurm"], job_shown["executor"], job_shown["slurm_job_id"]) == (
        "unknown",
        "ray",
        f"evald-{job}-1",
    )
    assert datetime.fromisoformat(job_shown["unknown_since"]) == since and job_shown["unknown_for_s"] >= 125
    assert shown["runs"]["toy"]["slurm"]["unknown"] == 1 and shown["runs"]["toy"]["slurm"]["running"] == 0
    # The API says the same.
    with TestClient(build(load_config(config))) as client:
        api = client.get("/api/v1/status").json()
    assert api["executor"]["reachable"] is False and api["executor"]["since"] == executor["since"]

    # The head answers again (the daemon says so, and stores Ray's answer on the job): no outage shown.
    outages.record(database, [Outage(True, since, WHAT, "ray", at=datetime.now(UTC))], OWNER)
    _set_state(database, job, running)
    text = _status(config, capsys)
    assert "executor:" not in text and "unknown" not in text and "  jobs:        running 1" in text
    assert json.loads(_status(config, capsys, "--format", "json"))["executor"]["reachable"] is True


def test_an_earlier_daemons_outage_is_ended_by_a_later_daemons_answer(
    database: Database, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon that died while the head was away leaves its outage stored; the next daemon's first
    answer (stored as reachable, whoever it is) ends it in what status says."""
    config = _ray_config(tmp_path, database_url)
    since = datetime.now(UTC) - timedelta(hours=1)
    outages.record(database, [Outage(False, since, WHAT, "ray", "refused")], "dead-host:1")
    assert "executor: unreachable since" in _status(config, capsys)
    outages.record(database, [Outage(True, datetime.now(UTC), WHAT, "ray", at=datetime.now(UTC))], OWNER)
    assert "executor:" not in _status(config, capsys)


_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " ()[]{}:;,./-_'", min_size=1, max_size=80)


@given(
    since=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
    ).map(lambda moment: moment.replace(microsecond=0)),
    what=_TEXT,
    last=st.one_of(st.none(), _TEXT),
)
def test_an_unknown_state_as_stored_is_read_back_unknown_with_its_start(
    since: datetime, what: str, last: str | None
) -> None:
    """Whatever the controller's description and the last state (brackets included), the stored line
    reads back as unknown, since ``since``, with what it said; never pending or running."""
    line = remote.unknown_line(since, what, last)
    phase, reason = scheduler_phase(line)
    assert phase == "unknown"
    assert reason == f"{what} does not answer" + (
        f"; last {last}" if last and not last.startswith("UNKNOWN") else ""
    )
    read = unknown_since(line)
    assert read is not None and datetime.fromisoformat(read) == since
    # A state that is not one of these lines is never read as unknown.
    assert scheduler_phase(f"RUNNING on {what}")[0] == "running"
