"""What ``evald status``, ``evald history`` and ``/api/v1/status`` say of jobs handed to Slurm, jobs held
back, multi-line errors and the trackers' backlogs (issue 32), on SQLite and PostgreSQL, from rows stored
through the real queue, claim, outbox and retry functions.

Jobs waiting in Slurm's queue are running to the database (claimed, submitted) but not to the user: the
status splits them from those running, with Slurm's reason and the wait so far."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from starlette.testclient import TestClient

from daemon.analysis import report
from daemon.analysis.report.status_summary import scheduler_phase
from daemon.analysis.report.tracker_rows import TrackerRef, trackers
from daemon.cli import main
from daemon.config import load_config
from daemon.running.executors.base import Handle
from daemon.web.server import build
from storage import outbox, queries, scheduling
from storage.database import Database
from storage.models import CheckpointState, EvalJob, OutboxMessage
from storage.queries.monitoring import OutboxBacklog, outbox_backlog
from storage.queries.retry import retry_job_rows
from tests.harness import write_config, write_dataset

OWNER = "node7:4242"
#: step → (Slurm job id, scheduler state as the dispatcher stores it, seconds since the claim).
IN_SLURM = {
    10: ("501", "PENDING (Resources)", 300.0),
    20: ("502", "PENDING (Resources)", 60.0),
    30: ("503", "RUNNING on node1", 900.0),
}
HELD = "held: max_queued_per_run 3 reached for run 'toy'"
CRASH = (
    "worker exit status 1: ValueError: bad batch\nTraceback (most recent call last):\n"
    '  File "/opt/evald/inference/generation.py", line 212, in generate_batch\n'
    "ValueError: bad batch: 3 prompts longer than max_prompt_tokens (4096)"
)
RETRY_ERROR = (
    "Slurm job 77 TIMEOUT on node2 after 600 s\n--- log tail ---\n"
    '{"event": "generation.batch", "batch": 40, "tokens": 65536, "seconds": 14.2}\n'
    '{"event": "generation.batch", "batch": 41, "tokens": 65536, "seconds": 14.9}'
)
REFUSED = "credentials refused (HTTP 401)\n<html>Unauthorized</html>"
#: The mlflow tracker's target before its experiment was changed: its rows there wait apart.
EARLIER = "mlflow:0123456789abcdef0123456789abcdef"
TRACKERS = """
[[trackers]]
kind = "mlflow"
tracking_uri = "http://127.0.0.1:9"
attach = "own"

[[trackers]]
kind = "tensorboard"
name = "tb"
"""


@dataclass(frozen=True)
class Stored:
    config: Path
    database: Database
    jobs: dict[int, int]


def _claim(database: Database, run_id: int, step: int, tasks: tuple[str, ...] = ("arith",)) -> int:
    with database.session() as s:
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
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=list(tasks))
    with database.session() as s:
        job = queries.claim_next_job(s, OWNER)
        assert job is not None and job.step == step
        return job.id


def _queued(database: Database, run_id: int, step: int) -> int:
    with database.session() as s:
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
        (row,) = [j for j in queries.job_rows(s, "toy", step=step)]
        return row.id


def _store(database: Database, target: str) -> dict[int, int]:
    """Jobs at each step: 10, 20 pending in Slurm, 30 running there, 40 and 50 held back, 60 failed with
    a crashed worker's log tail, 70 retrying after a TIMEOUT; the trackers' outbox rows."""
    with database.session() as s:
        run_id = queries.ensure_run(s, "toy", "/toy")
    jobs: dict[int, int] = {}
    now = datetime.now(UTC)
    for step, (slurm_id, state, waited) in IN_SLURM.items():
        job = jobs[step] = _claim(database, run_id, step)
        handle = Handle("slurm", job, 1, Path(f"/state/jobs/{job}-1"), slurm_id)
        with database.session() as s:
            assert queries.record_handle(s, job_id=job, owner=OWNER, attempt=1, handle=handle.to_json())
            assert queries.set_executor_state(s, job_id=job, owner=OWNER, attempt=1, state=state)
            s.execute(
                update(EvalJob).where(EvalJob.id == job).values(started_at=now - timedelta(seconds=waited))
            )
    jobs[60] = _claim(database, run_id, 60)
    with database.session() as s:
        assert queries.fail_job(s, job_id=jobs[60], owner=OWNER, kind="crash", error=CRASH, duration_s=3.0)
        queries.record_attempt(s, _attempt(jobs[60], 1, "failed", "crash", CRASH, now))
    jobs[70] = _claim(database, run_id, 70)
    with database.session() as s:
        assert queries.fail_job(
            s, job_id=jobs[70], owner=OWNER, kind="timeout", error=RETRY_ERROR, duration_s=600.0, retry=True
        )
        queries.record_attempt(
            s, _attempt(jobs[70], 1, "retried", "timeout", RETRY_ERROR, now, slurm=("77", "node2", "TIMEOUT"))
        )
    with database.session() as s:
        # Deferred for a while, then released: the deferral's reason stays on the pending job (not a hold).
        scheduling.defer_pending(s, "gpu busy", now)
        scheduling.release_deferred(s)
    for step in (40, 50):
        jobs[step] = _queued(database, run_id, step)
    with database.session() as s:
        # As the dispatcher says it when it holds a run's jobs back.
        scheduling.hold_pending(s, {run_id: HELD})
    _store_outbox(database, run_id, now, target)
    return jobs


def _attempt(
    job: int,
    attempt: int,
    outcome: str,
    kind: str | None,
    error: str | None,
    now: datetime,
    slurm: tuple[str, str, str] | None = None,
) -> queries.AttemptRow:
    slurm_id, nodes, exit_state = slurm if slurm is not None else (None, None, None)
    return queries.AttemptRow(
        job_id=job,
        attempt=attempt,
        engine="hf",
        tp=1,
        dp=1,
        batch_size=8,
        outcome=outcome,
        error_kind=kind,
        error=error,
        started_at=now - timedelta(seconds=700),
        finished_at=now - timedelta(seconds=60),
        duration_s=640.0,
        slurm_job_id=slurm_id,
        nodes=nodes,
        queue_wait_s=40.0 if slurm else None,
        run_s=600.0 if slurm else None,
        exit_state=exit_state,
    )


def _store_outbox(database: Database, run_id: int, now: datetime, target: str) -> None:
    """mlflow (sending to ``target`` now): one delivered, two failing (tried twice, refused credentials),
    one more under an endpoint with a suffix, one for its target; two for where it pointed before; tb: up
    to date; ``tracker:mlflowx`` (another name, not configured): one waiting."""

    def queue(endpoint: str, n: int, age_s: float, to: str | None = None) -> list[int]:
        with database.session() as s:
            for i in range(n):
                assert outbox.enqueue_message(
                    s, run_id=run_id, endpoint=endpoint, event_id=f"{endpoint}-{to}-{i}", body="{}", target=to
                )
            ids = [
                m.id
                for m in s.query(OutboxMessage)
                .filter(
                    OutboxMessage.endpoint == endpoint,
                    OutboxMessage.target.is_(to) if to is None else OutboxMessage.target == to,
                )
                .order_by("id")
            ]
            s.execute(
                update(OutboxMessage)
                .where(OutboxMessage.id.in_(ids))
                .values(created_at=now - timedelta(seconds=age_s))
            )
            return ids

    mlflow = queue("tracker:mlflow", 3, 600)
    tried = outbox.Attempt(now, 0.2, 401, None)
    with database.session() as s:
        outbox.record_attempts(s, mlflow[:1], outbox.Attempt(now, 0.1, 200, None))
        outbox.delivered_many(s, mlflow[:1])
        for _ in range(2):
            outbox.record_attempts(s, mlflow[1:], tried)
        outbox.retry_many_at(s, mlflow[1:], now + timedelta(seconds=120), REFUSED)
    queue("tracker:mlflow@http://other:5000", 1, 30)
    queue("tracker:mlflow", 1, 20, target)
    queue("tracker:mlflow", 2, 3000, EARLIER)
    tb = queue("tracker:tb", 2, 100)
    with database.session() as s:
        outbox.record_attempts(s, tb, outbox.Attempt(now, 0.1, None, None))
        outbox.delivered_many(s, tb)
    queue("tracker:mlflowx", 1, 5)


@pytest.fixture
def stored(database: Database, database_url: str, tmp_path: Path) -> Iterator[Stored]:
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "d.jsonl", 2))
    with config.open("a") as extra:
        extra.write(TRACKERS)
    (mlflow, _) = load_config(config).trackers
    yield Stored(config, database, _store(database, mlflow.target))


def _status(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["--config", str(config), "status", *extra]) == 0
    return capsys.readouterr().out


def test_status_splits_slurm_queue_from_running_and_shows_held_errors_and_trackers(
    stored: Stored, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = json.loads(_status(stored.config, capsys, "--format", "json"))
    toy = shown["runs"]["toy"]
    # The database's states stay as they are; Slurm's view is beside them.
    assert toy["jobs"]["running"] == 3 and toy["jobs"]["pending"] == 3 and toy["jobs"]["failed"] == 1
    assert toy["slurm"] == {
        "pending": 2,
        "running": 1,
        "unknown": 0,
        "reasons": {"Resources": 2},
        "executor": "slurm",
    }
    by_step = {j["step"]: j for j in toy["running"]}
    assert [by_step[s]["in_slurm"] for s in (10, 20, 30)] == ["pending", "pending", "running"]
    assert [by_step[s]["slurm_job_id"] for s in (10, 20, 30)] == ["501", "502", "503"]
    # The wait so far counts from the claim that submitted it; one running has no queue wait here.
    assert 300 <= by_step[10]["queue_wait_s"] < 360 and 60 <= by_step[20]["queue_wait_s"] < 120
    assert by_step[30]["queue_wait_s"] is None
    assert [(h["step"], h["reason"]) for h in toy["held"]] == [(40, HELD), (50, HELD)]
    # Job 70 waits too, its reason a deferral's from before its release: not a hold, not listed.
    with stored.database.session() as s:
        (seventy,) = queries.job_rows(s, "toy", step=70)
    assert (seventy.state, seventy.wait_reason) == ("pending", "gpu busy")
    # JSON keeps errors whole.
    (failed,) = [p for p in toy["problems"] if "job" in p]
    assert failed["reason"] == CRASH
    (retrying,) = toy["retrying"]
    assert retrying["error"] == RETRY_ERROR

    text = _status(stored.config, capsys)
    assert "  jobs:        failed 1, pending 3, pending in Slurm 2 (Resources), running 1" in text, text
    (wait10,) = [line for line in text.splitlines() if f"(job {stored.jobs[10]})" in line]
    assert re.search(
        r"in Slurm: +step 10 \[arith/full\] .*Slurm job 501 PENDING \(Resources\), waiting 5m", wait10
    )
    assert f"attempt 1 of 3, submitted by {OWNER}" in wait10
    assert f"running:     step 30 [arith/full] (job {stored.jobs[30]}) on {OWNER}" in text
    assert "slurm:     job 503: RUNNING on node1" in text
    assert "  held:        2 job(s), step(s) 40, 50: max_queued_per_run 3 reached for run 'toy'" in text
    # A multi-line error: its first line, then how many lines are left out and where they are.
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("  failed: step_60")]
    assert lines[at].endswith("worker exit status 1: ValueError: bad batch")
    assert lines[at + 1].strip() == f"(3 more lines: evald history {stored.jobs[60]})"
    (at,) = [i for i, line in enumerate(lines) if line.startswith("  retrying:")]
    assert lines[at].endswith("last error timeout: Slurm job 77 TIMEOUT on node2 after 600 s")
    assert lines[at + 1].strip() == f"(3 more lines: evald history {stored.jobs[70]})"
    assert "Traceback" not in text and "log tail" not in text

    # Trackers: the failing one with its backlog, error and next try; the one up to date; a leftover.
    mlflow, tb, leftover = shown["trackers"]
    assert (mlflow["name"], mlflow["state"], mlflow["pending"], mlflow["attempts"]) == (
        "mlflow",
        "failing",
        4,
        2,
    )
    # Its rows for where it pointed before are not its backlog: they wait apart, counted.
    assert mlflow["earlier_targets"] == [{"target": EARLIER, "pending": 2, "delivered": 0}]
    assert mlflow["endpoints"] == ["tracker:mlflow", "tracker:mlflow@http://other:5000"]
    assert mlflow["last_error"] == REFUSED and mlflow["delivered"] == 1
    assert 600 <= mlflow["oldest_pending_age_s"] < 700
    # The soonest try: the message under the second keying was never tried, so it is due already.
    assert mlflow["next_attempt_in_s"] <= 0
    assert (tb["name"], tb["state"], tb["pending"], tb["delivered"]) == ("tb", "up to date", 0, 2)
    assert (leftover["name"], leftover["configured"], leftover["pending"]) == ("mlflowx", False, 1)
    assert "trackers:" in text
    assert re.search(
        r"  mlflow \(mlflow\): FAILING: 4 pending, oldest 10m \d\ds old; tried 2 time\(s\)", text
    )
    assert "    last error: credentials refused (HTTP 401) (1 more line in --format json)" in text
    assert (
        "    earlier target(s): 2 message(s) wait for where it pointed before (1 target(s)); "
        "sent only if it points there again"
    ) in text
    assert "  tb (tensorboard): up to date, 2 delivered" in text
    assert "  mlflowx (not in the config: tracker:mlflowx): sending: 1 pending" in text


def test_errors_cut_to_the_terminal_width(stored: Stored) -> None:
    config = load_config(stored.config)
    from daemon.analysis.run_status import run_summaries

    with stored.database.session() as s:
        runs = run_summaries(s, config, ["toy"])
    text = report.status_text(runs, width=60)
    (line,) = [line for line in text.splitlines() if line.startswith("  failed: step_60")]
    # Never cut below 40 characters of the error, however narrow; cut with an ellipsis.
    assert line.endswith("…") and len(line.split("): ", 1)[1]) == 40, line


def test_history_shows_first_lines_and_json_whole(stored: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    job = stored.jobs[70]
    assert main(["--config", str(stored.config), "history", str(job)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].split() == [
        "attempt", "outcome", "engine", "tp", "dp", "batch_size", "duration_s", "slurm_job_id", "nodes",
        "queue_wait_s", "run_s", "exit_state", "error_kind", "error",
    ]  # fmt: skip
    assert lines[2].endswith("Slurm job 77 TIMEOUT on node2 after 600 s (3 more lines)")
    assert f"`evald history {job} --format json` shows them whole" in text
    assert "log tail" not in text
    # The job waits for its next claim after the retried attempt: said under the table.
    assert lines[-1] == "attempt 2: pending: queued, no daemon has claimed it yet"
    assert main(["--config", str(stored.config), "history", str(job), "--format", "json"]) == 0
    (first, queued) = json.loads(capsys.readouterr().out)
    assert (
        first["error"] == RETRY_ERROR and first["exit_state"] == "TIMEOUT" and queued["outcome"] == "pending"
    )
    # `evald retry` keeps the failed job's attempt, and its history says so.
    with stored.database.session() as s:
        (target,) = retry_job_rows(s, job_id=stored.jobs[60])
    assert target.outcome == "queued"
    assert main(["--config", str(stored.config), "history", str(stored.jobs[60])]) == 0
    text = capsys.readouterr().out
    assert "worker exit status 1: ValueError: bad batch (3 more lines)" in text
    assert text.splitlines()[-1] == "attempt 2: pending: queued, no daemon has claimed it yet"


def test_api_status_and_a_steps_jobs(stored: Stored) -> None:
    app = build(load_config(stored.config), environ={})
    try:
        client = TestClient(app, raise_server_exceptions=False)
        body = client.get("/api/v1/status").json()
        toy = body["runs"]["toy"]
        assert toy["slurm"] == {
            "pending": 2,
            "running": 1,
            "unknown": 0,
            "reasons": {"Resources": 2},
            "executor": "slurm",
        }
        assert [h["step"] for h in toy["held"]] == [40, 50]
        assert [(t["name"], t["state"]) for t in body["trackers"]] == [
            ("mlflow", "failing"),
            ("tb", "up to date"),
            ("mlflowx", "sending"),
        ]
        assert client.get("/api/v1/status?run=toy").json()["runs"]["toy"]["slurm"]["pending"] == 2
        # A step's jobs, each one's attempts a request away (the dashboard's detail panel).
        with stored.database.session() as s:
            # The retried job is claimed again after every fresh one (a failed attempt queues behind them).
            claimed = list(iter(lambda: queries.claim_next_job(s, OWNER), None))
            assert claimed and [j.attempts > 0 for j in claimed] == sorted(j.attempts > 0 for j in claimed)
            (done,) = [j for j in claimed if j.step == 70]
            assert queries.complete_job(
                s,
                job_id=done.id,
                owner=OWNER,
                metrics=[queries.MetricRow("accuracy", 0.5, 10, 0.1)],
                samples=[],
                duration_s=2.0,
                load_s=0.1,
                attempt=2,
            )
        step = client.get("/api/v1/runs/toy/steps/70").json()
        (job,) = step["jobs"]
        assert (job["id"], job["state"], job["attempts"], job["error"]) == (done.id, "succeeded", 2, None)
        attempts = client.get(f"/api/v1/jobs/{done.id}").json()["attempts"]
        assert [(a["attempt"], a["outcome"], a["slurm_job_id"]) for a in attempts] == [(1, "retried", "77")]
    finally:
        app.state.web.database.dispose()


def test_scheduler_phases_and_tracker_keying() -> None:
    assert scheduler_phase("PENDING (Priority)") == ("pending", "Priority")
    assert scheduler_phase("REQUEUED (BeginTime)") == ("pending", "BeginTime")
    assert scheduler_phase(None) == ("pending", None)  # submitted, not polled since
    assert scheduler_phase("RUNNING on node1") == ("running", None)
    assert scheduler_phase("COMPLETING") == ("running", None)
    now = datetime.now(UTC)

    def backlog(endpoint: str, pending: int = 1) -> OutboxBacklog:
        return OutboxBacklog(endpoint, pending, now, now, None, 0, 0, 0, 0, None)

    refs = [TrackerRef("mlflow", "mlflow", "tracker:mlflow"), TrackerRef("ml", "mlflow", "tracker:ml")]
    found = trackers(
        refs,
        [
            backlog("tracker:ml"),
            backlog("tracker:ml.2"),
            backlog("tracker:mlflow"),
            backlog("tracker:mlflow/x"),
        ],
        now,
    )
    assert [(t["name"], t["endpoints"]) for t in found] == [
        ("mlflow", ["tracker:mlflow", "tracker:mlflow/x"]),
        ("ml", ["tracker:ml"]),
        ("ml.2", ["tracker:ml.2"]),
    ]


def test_outbox_backlog_reads_only_the_prefix(database: Database) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", "/r")
        outbox.enqueue_message(s, run_id=run_id, endpoint="hook", event_id="h1", body="{}")
        outbox.enqueue_message(s, run_id=run_id, endpoint="tracker:a_b", event_id="t1", body="{}")
        for i in range(2):
            outbox.enqueue_message(
                s, run_id=run_id, endpoint="tracker:a_b", event_id=f"t2{i}", body="{}", target="mlflow:x"
            )
        outbox.disable_endpoint(s, "tracker:gone", "410 Gone")
    with database.session() as s:
        found: list[Any] = outbox_backlog(s, "tracker:")
    # One entry per endpoint and target (rows queued with none, and a target's).
    assert [(b.endpoint, b.target, b.pending, b.disabled_reason) for b in found] == [
        ("tracker:a_b", None, 1, None),
        ("tracker:a_b", "mlflow:x", 2, None),
        ("tracker:gone", None, 0, "410 Gone"),
    ]
    # A LIKE wildcard in the prefix is a plain character.
    with database.session() as s:
        assert outbox_backlog(s, "tracker:a%") == []


def test_history_keeps_a_short_multi_line_error_whole_on_one_line() -> None:
    now = datetime.now(UTC)
    short = _attempt(
        1, 1, "out_of_memory", "out_of_memory", "rank 0: out of memory at batch 16:\n  CUDA", now
    )
    text = report.history([short], "table")
    (row,) = text.splitlines()[2:]
    assert row.endswith("rank 0: out of memory at batch 16: CUDA") and "shows them whole" not in text
    # Narrow, the same error is cut to its first line, and says so.
    text = report.history([short], "table", width=116)
    assert text.splitlines()[2].endswith("rank 0: out of memory at batch 16: (1 more line)")
    assert "errors are cut to their first line" in text


def test_a_job_waiting_in_rays_queue_is_said_to_be_in_ray_with_its_reason() -> None:
    """The executor's own name and reason, from the handle the runner recorded (a Ray job here)."""
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    handle = Handle(executor="ray", job_id=7, attempt=1, job_dir=Path("/jobs/7"), external_id="evald-7-1")
    waiting = {
        "job": 7,
        "step": 10,
        "task": "arith",
        "stage": "full",
        "attempt": 1,
        "max_attempts": 3,
        "held_by": OWNER,
        "started_at": (now - timedelta(seconds=90)).isoformat(),
        "heartbeat_at": None,
    }
    runs: dict[str, dict[str, Any]] = {
        "toy": {
            "jobs": {"running": 1},
            "checkpoints": {"ready": 1},
            "last_evaluated_step": None,
            "problems": [],
        }
    }
    runs["toy"]["running"] = [waiting]
    why = "waiting for resources: 1 bundle {CPU: 1} (STRICT_PACK)"
    shown = report.with_scheduler(runs, {7: (handle.to_json(), f"PENDING ({why})")}, now)
    assert shown["toy"]["slurm"] == {
        "pending": 1,
        "running": 0,
        "unknown": 0,
        "reasons": {why: 1},
        "executor": "ray",
    }
    (job,) = shown["toy"]["running"]
    assert (job["executor"], job["slurm_job_id"], job["queue_wait_s"]) == ("ray", "evald-7-1", 90.0)
    text = report.status_text(shown)
    assert f"  jobs:        pending in Ray 1 ({why}), running 0" in text, text
    assert f"  in Ray:      step 10 [arith/full] (job 7): Ray job evald-7-1 PENDING ({why}), waiting" in text
    assert "Slurm" not in text
