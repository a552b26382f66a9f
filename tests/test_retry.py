"""``evald retry`` and ``evald history`` of a job not yet run, through the real CLI on SQLite and PostgreSQL.

A failed checkpoint is retried once its cause is fixed and succeeds under a real daemon, with both attempts
in its history; a retry is refused for a job that succeeded, runs or is skipped (naming its state), queues
one job however often it is asked, and ``--run R --failed`` touches only that run's failed jobs beside
good ones. A job claimed and submitted to Slurm but not yet run shows its submission in ``evald history``.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from storage import queries
from storage.database import Database
from storage.models import CheckpointState, EvalJob, JobState
from storage.queries.retry import retry_job_rows
from tests.conftest import ToyRun
from tests.harness import evald, jobs, running_daemon, upgraded, wait_for, write_config, write_dataset

OWNER = "host-a:1"


@pytest.fixture
def config(tmp_path: Path, database_url: str) -> Path:
    return write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "arith.jsonl", 4))


def _checkpoint(session: Session, run: str, step: int, tasks: tuple[str, ...] = ("arith",)) -> list[int]:
    """A ready checkpoint of ``run`` at ``step`` with a pending job per task; returns their ids, in order."""
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
    queries.enqueue_jobs(session, checkpoint_id=checkpoint_id, step=step, tasks=tasks)
    ids = {j.task: j.id for j in queries.job_rows(session, run) if j.step == step}
    return [ids[task] for task in tasks]


def _end(database: Database, job_id: int, state: JobState, kind: str | None = None) -> None:
    """Put a job where a daemon would have left it (an attempt of it spent)."""
    with database.session() as session:
        session.execute(
            update(EvalJob)
            .where(EvalJob.id == job_id)
            .values(
                state=state, attempts=EvalJob.attempts + 1, error_kind=kind, error=kind and f"{kind} here"
            )
        )


def _states(database: Database) -> dict[int, str]:
    return {j.id: j.state for j in jobs(database)}


def _cli(config: Path, *args: str) -> tuple[int, str, str]:
    done = evald("--config", str(config), *args)
    return done.returncode, done.stdout, done.stderr


def test_run_failed_retries_only_that_runs_failed_jobs(config: Path, database_url: str) -> None:
    database = upgraded(database_url)
    with database.session() as s:
        (a10,) = _checkpoint(s, "a", 10)
        (a20,) = _checkpoint(s, "a", 20)
        (a30,) = _checkpoint(s, "a", 30)
        (a40,) = _checkpoint(s, "a", 40)
        (b10,) = _checkpoint(s, "b", 10)
    _end(database, a10, JobState.FAILED, "load_error")
    _end(database, a20, JobState.SUCCEEDED)
    _end(database, a30, JobState.FAILED, "cancelled")
    _end(database, b10, JobState.FAILED, "load_error")  # another run's: stays failed
    before = _states(database)

    code, out, err = _cli(config, "retry", "--run", "a", "--failed", "--format", "json")

    assert code == 0, err
    assert {(t["job_id"], t["outcome"]) for t in json.loads(out)} == {(a10, "queued"), (a30, "queued")}
    assert _states(database) == {**before, a10: "pending", a30: "pending"}
    assert before[a40] == "pending" and before[a20] == "succeeded"
    with database.session() as s:
        # The attempt count is kept (a fencing token and a worker folder's name are never reused) and the
        # error stays readable until the job runs again.
        (row,) = [j for j in queries.job_rows(s, "a") if j.id == a10]
    assert (row.attempts, row.error_kind) == (1, "load_error")
    database.dispose()


def test_cancelled_step_and_task_narrow_the_selection(config: Path, database_url: str) -> None:
    database = upgraded(database_url)
    with database.session() as s:
        a10, b10 = _checkpoint(s, "r", 10, ("arith", "other"))
        (c20,) = _checkpoint(s, "r", 20)
        (d30,) = _checkpoint(s, "r", 30)
    _end(database, a10, JobState.FAILED, "cancelled")
    _end(database, b10, JobState.FAILED, "cancelled")
    _end(database, c20, JobState.FAILED, "cancelled")
    _end(database, d30, JobState.FAILED, "crash")

    code, out, err = _cli(config, "retry", "--run", "r", "--cancelled", "--step", "10", "--task", "other")
    assert code == 0, err
    assert "1 job(s) queued again" in out
    assert _states(database) == {a10: "failed", b10: "pending", c20: "failed", d30: "failed"}

    # --cancelled leaves a job that failed for another reason; --failed takes it.
    assert _cli(config, "retry", "--run", "r", "--cancelled")[0] == 0
    assert _states(database) == {a10: "pending", b10: "pending", c20: "pending", d30: "failed"}
    code, out, _ = _cli(config, "retry", "--run", "r", "--failed", "--step", "999")
    assert (code, out.strip()) == (0, "run r: no failed job to retry")
    database.dispose()


def test_retry_is_refused_naming_the_state_and_queues_once(config: Path, database_url: str) -> None:
    database = upgraded(database_url)
    with database.session() as s:
        (done,) = _checkpoint(s, "r", 10)
        (failed,) = _checkpoint(s, "r", 20)
        (running,) = _checkpoint(s, "r", 30)
        (skipped,) = _checkpoint(s, "r", 40)
    _end(database, done, JobState.SUCCEEDED)
    _end(database, failed, JobState.FAILED, "crash")
    _end(database, skipped, JobState.SKIPPED)
    with database.session() as s:
        claimed = queries.claim_next_job(s, OWNER)
    assert claimed is not None and claimed.id == running

    for job_id, said in (
        (done, f"job {done} is succeeded: it succeeded: its results are stored"),
        (running, f"job {running} is running: it is running now"),
        (skipped, f"job {skipped} is skipped: it was skipped for a newer checkpoint"),
    ):
        code, out, err = _cli(config, "retry", str(job_id))
        assert code == 1 and out == ""
        assert err.startswith(f"evald: error: cannot retry: {said}"), err
    assert _cli(config, "retry", "9999")[2] == "evald: error: no job 9999 (see `evald status` for job ids)\n"

    # Retried twice: one job queued; the second answer says it already is, and succeeds.
    first, second = _cli(config, "retry", str(failed)), _cli(config, "retry", str(failed))
    assert first[0] == 0 and "1 job(s) queued again" in first[1]
    assert second[0] == 0 and "0 job(s) queued again" in second[1] and "already queued" in second[1]
    states = _states(database)
    assert (states[done], states[failed], states[running], states[skipped]) == (
        "succeeded",
        "pending",
        "running",
        "skipped",
    )
    # Claimed by a daemon like any queued job, once: a second claimer finds nothing.
    with database.session() as s:
        again = queries.claim_next_job(s, "host-b:2")
    with database.session() as s:
        assert again is not None and again.id == failed and again.attempts == 2
        assert queries.claim_next_job(s, "host-c:3") is None
    database.dispose()


def test_two_retries_at_once_queue_one_job(database_url: str) -> None:
    """Both transactions see the job failed; the second's conditioned update finds it moved."""
    database = upgraded(database_url)
    with database.session() as s:
        (job,) = _checkpoint(s, "r", 10)
    _end(database, job, JobState.FAILED, "crash")
    with database.session() as first:
        got = retry_job_rows(first, job_id=job)
    with database.session() as second:
        again = retry_job_rows(second, job_id=job)
    assert [t.outcome for t in got] == ["queued"] and [t.outcome for t in again] == ["already_queued"]
    assert _states(database) == {job: "pending"}
    database.dispose()


def test_a_gone_checkpoint_is_not_retried(config: Path, database_url: str) -> None:
    database = upgraded(database_url)
    with database.session() as s:
        (gone,) = _checkpoint(s, "r", 10)
        (good,) = _checkpoint(s, "r", 20)
        run_id = queries.ensure_run(s, "r", "/runs/r")
        queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/runs/r/step_10",
            name="step_10",
            step=10,
            epoch=None,
            layout="hf",
            state=CheckpointState.VANISHED,
        )
    _end(database, gone, JobState.FAILED, "checkpoint_vanished")
    _end(database, good, JobState.FAILED, "crash")
    code, out, err = _cli(config, "retry", "--run", "r", "--failed")
    assert code == 0, err
    assert "1 job(s) queued again" in out and "/runs/r/step_10 is vanished: nothing to evaluate" in out
    assert _states(database) == {gone: "failed", good: "pending"}
    database.dispose()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("retry",), "evald: retry: give a job id (evald retry 42) or a run (evald retry --run R --failed)"),
        (("retry", "--run", "r"), "evald: --run: say which of the run's jobs: --failed, --cancelled or both"),
        (("retry", "3", "--failed"), "evald: --failed: give a job id or --run R with its filters, not both"),
    ],
)
def test_a_retry_that_names_nothing_is_refused_before_the_database(
    tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    # No database is reachable at this URL: the arguments are refused before it is opened.
    config = write_config(tmp_path, "postgresql://nobody@127.0.0.1:1/none", dataset=tmp_path / "x.jsonl")
    code, out, err = _cli(config, *args)
    assert (code, out) == (2, "")
    assert err.startswith(said), err


def test_history_shows_a_submission_queued_in_slurm(config: Path, database_url: str) -> None:
    database = upgraded(database_url)
    with database.session() as s:
        queued, submitted = _checkpoint(s, "r", 10, ("arith", "other"))
    with database.session() as s:
        claimed = queries.claim_next_job(s, OWNER, tasks=["other"])
        assert claimed is not None and claimed.id == submitted
        handle = {
            "executor": "slurm",
            "job_id": submitted,
            "attempt": 1,
            "job_dir": "/state/jobs/x",
            "external_id": "4242",
        }
        queries.record_handle(s, job_id=submitted, owner=OWNER, attempt=1, handle=json.dumps(handle))
        queries.set_executor_state(s, job_id=submitted, owner=OWNER, attempt=1, state="PENDING (Resources)")

    code, out, err = _cli(config, "history", str(submitted))
    assert code == 0, err
    assert out.startswith(f"attempt 1: submitted to Slurm as job 4242 by {OWNER}, PENDING (Resources), ")
    code, out, err = _cli(config, "history", str(submitted), "--format", "json")
    (row,) = json.loads(out)
    assert (row["attempt"], row["outcome"], row["slurm_job_id"], row["executor_state"]) == (
        1,
        "running",
        "4242",
        "PENDING (Resources)",
    )
    assert row["since_claim_s"] >= 0

    # Never claimed: it says so, and exits 0; a job that does not exist is the error.
    code, out, _ = _cli(config, "history", str(queued))
    assert (code, out) == (0, "attempt 1: pending: queued, no daemon has claimed it yet\n")
    assert _cli(config, "history", "9999")[0:2] == (1, "")
    database.dispose()


#: Strict JSON, so the scan passes it (a tokenizer.json that is not JSON is refused there, with no job);
#: the tokenizers library refuses it in the worker.
BROKEN_TOKENIZER = '{"version": "1.0", "added_tokens": [], "model": 5}'


@pytest.mark.slow
def test_a_failed_checkpoint_retried_after_the_fix_succeeds(
    tmp_path: Path, database_url: str, toy_run: ToyRun
) -> None:
    """A real daemon fails a checkpoint whose tokenizer is broken and evaluates the good one beside it;
    the tokenizer mended, ``evald retry`` queues the job again and the daemon runs it: both attempts are
    in its history, and the good job is untouched."""
    dataset = write_dataset(tmp_path / "arith.jsonl", 4)
    config = write_config(tmp_path, database_url, dataset=dataset, inference_extra="max_attempts = 1")
    root = tmp_path / "run"
    for step in (15, 30):
        shutil.copytree(toy_run.path / f"step_{step}", root / f"step_{step}")
    tokenizer = root / "step_15" / "tokenizer.json"
    tokenizer.write_text(BROKEN_TOKENIZER)
    database = upgraded(database_url)
    log = tmp_path / "daemon.log"

    def ended() -> dict[int | None, str] | None:
        rows = jobs(database)
        done = len(rows) == 2 and all(j.state in ("succeeded", "failed") for j in rows)
        return {j.step: j.state for j in rows} if done else None

    with running_daemon(config, log) as daemon:
        assert wait_for(ended, 240, "both jobs ended", daemon.process) == {15: "failed", 30: "succeeded"}
        (bad,) = [j for j in jobs(database) if j.step == 15]
        (good,) = [j for j in jobs(database) if j.step == 30]
        code, _, err = _cli(config, "retry", str(good.id))
        assert code == 1 and f"job {good.id} is succeeded" in err

        shutil.copy(toy_run.path / "step_15" / "tokenizer.json", tokenizer)
        code, out, err = _cli(config, "retry", "--run", "toy", "--failed")
        assert code == 0 and "1 job(s) queued again" in out, err

        def succeeded() -> bool:
            return {j.id: j.state for j in jobs(database)}[bad.id] == "succeeded"

        wait_for(succeeded, 240, "the retried job to succeed", daemon.process)
        assert daemon.stop() == 0

    code, out, err = _cli(config, "history", str(bad.id), "--format", "json")
    assert code == 0, err
    attempts = json.loads(out)
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [(1, "failed"), (2, "succeeded")]
    assert attempts[0]["error"]
    code, out, _ = _cli(config, "history", str(good.id), "--format", "json")
    assert [a["outcome"] for a in json.loads(out)] == ["succeeded"]
    database.dispose()


def test_the_api_shows_a_retried_jobs_attempts_and_stays_read_only(config: Path, database_url: str) -> None:
    from starlette.testclient import TestClient

    from daemon.config import load_config
    from daemon.web.server import build

    database = upgraded(database_url)
    with database.session() as s:
        (job,) = _checkpoint(s, "r", 10)
        claimed = queries.claim_next_job(s, OWNER)
        assert claimed is not None
        queries.record_attempt(
            s,
            queries.AttemptRow(
                job_id=job,
                attempt=1,
                engine="hf",
                tp=1,
                dp=1,
                batch_size=4,
                outcome="failed",
                error_kind="load_error",
                error="tokenizer.json: not JSON",
                started_at=datetime(2026, 1, 1, tzinfo=UTC),
                finished_at=datetime(2026, 1, 1, 0, 1, tzinfo=UTC),
                duration_s=60.0,
            ),
        )
        assert queries.fail_job(
            s, job_id=job, owner=OWNER, kind="load_error", error="tokenizer.json: not JSON", duration_s=60.0
        )
    assert _cli(config, "retry", str(job))[0] == 0
    app = build(load_config(config), environ={})
    try:
        client = TestClient(app, raise_server_exceptions=False)
        body = client.get(f"/api/v1/jobs/{job}").json()
        assert (body["job"]["id"], body["job"]["state"], body["job"]["attempts"]) == (job, "pending", 1)
        assert [(a["attempt"], a["outcome"]) for a in body["attempts"]] == [(1, "failed"), (2, "pending")]
        assert body["attempts"][0]["error"] == "tokenizer.json: not JSON"
        missing = client.get("/api/v1/jobs/9999")
        assert (missing.status_code, missing.json()["error"]) == (
            404,
            "no job 9999 (the jobs are listed at /api/v1/jobs)",
        )
        assert client.get("/api/v1/jobs/x").status_code == 404
        # Retrying is the CLI's: the API takes no writing method.
        refused = client.post(f"/api/v1/jobs/{job}/retry")
        assert refused.status_code in (404, 405)
        assert client.post(f"/api/v1/jobs/{job}").status_code == 405
    finally:
        app.state.web.database.dispose()
    assert _states(database) == {job: "pending"}
    database.dispose()
