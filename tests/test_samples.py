"""Per-sample details and a job's problems: stored by the real queries (and by the job runner from a
worker's result), read back with ``evald samples`` as a user reads them, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import stat
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from daemon.cli import main
from daemon.config import Config, DaemonConfig, InferenceConfig, RunConfig, TaskConfig
from daemon.running.runner import JobRunner
from inference.spec import JobResult, MetricValue, Problem, SampleOutput, Timing
from storage import migrations, queries
from storage.database import Database
from storage.models import CheckpointState, UTCDateTime
from tests.deadlines import Deadline
from tests.harness import write_config

Sample = queries.SampleRow

#: The full job at step 10: two prompts, two completions each; one graded right, two wrong, one whose
#: reward raised (left out of the metrics, so neither right nor wrong).
FULL_SAMPLES = [
    Sample(0, "q1", "1+1=", "The answer is\n\\boxed{2}", "2", "2", True, 9, False, 1.0, 0.31, None),
    Sample(1, "q1", "1+1=", "I think   3", "3", "2", False, 5, False, 0.0, 0.92, None),
    Sample(2, "q2", "2+3=", "x" * 500 + "\nstill going", None, "5", False, 32, True, 0.0, 1.7, None),
    Sample(
        3, "q2", "2+3=", "\\boxed{five}", "five", "5", False, 7, False, None, 0.5, "reward raised ValueError"
    ),
]
FULL_PROBLEMS = [
    queries.ProblemRow("data/arith.jsonl:3", "invalid JSON: Expecting value"),
    queries.ProblemRow("sample 3", "reward raised ValueError", prompt_id="q2", index=3),
]
QUICK_SAMPLES = [Sample(0, "q7", "3+4=", "7", "7", "7", True, 2, False, 1.0, 0.1, None)]
METRICS = [queries.MetricRow("accuracy", 0.25, 4, 0.2)]


@dataclass(frozen=True)
class Stored:
    full: int
    quick: int
    failed: int


def _job(
    db: Database,
    run: str,
    step: int,
    task: str,
    stage: str,
    *,
    samples: list[queries.SampleRow] | None = None,
    problems: list[queries.ProblemRow] | None = None,
    error: str | None = None,
) -> int:
    """A job queued the way the planner queues it, then stored (``samples``), failed (``error``) or left
    pending (neither). Claims take the only pending job, so pending ones must be made last."""
    with db.session() as s:
        run_id = queries.ensure_run(s, run, f"/runs/{run}")
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/runs/{run}/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[task], stage=stage)
    if samples is None and error is None:
        with db.session() as s:
            return next(
                j.id for j in queries.job_rows(s, run) if (j.step, j.task, j.stage) == (step, task, stage)
            )
    with db.session() as s:
        job = queries.claim_next_job(s, "test:1")
    assert job is not None and (job.step, job.task, job.stage) == (step, task, stage)
    with db.session() as s:
        if error is not None:
            assert queries.fail_job(
                s, job_id=job.id, owner="test:1", kind="checkpoint_invalid", error=error, duration_s=1.0
            )
        else:
            assert queries.complete_job(
                s,
                job_id=job.id,
                owner="test:1",
                metrics=METRICS,
                samples=samples or [],
                problems=problems or [],
                duration_s=2.0,
                load_s=0.5,
            )
    return job.id


def _store(db: Database) -> Stored:
    """Run ``toy``: step 10 has arith full and quick (stored) and gsm8k (failed); step 20 a stored quick
    job whose full job is still pending; step 30 only a quick job. Run ``other`` has one checkpoint."""
    full = _job(db, "toy", 10, "arith", "full", samples=FULL_SAMPLES, problems=FULL_PROBLEMS)
    quick = _job(db, "toy", 10, "arith", "quick", samples=QUICK_SAMPLES)
    failed = _job(db, "toy", 10, "gsm8k", "full", error="bad header in\nmodel.safetensors")
    _job(db, "toy", 20, "arith", "quick", samples=QUICK_SAMPLES)
    _job(db, "toy", 30, "arith", "quick", samples=QUICK_SAMPLES)
    _job(db, "other", 5, "arith", "full", samples=[])
    _job(db, "toy", 20, "arith", "full")
    return Stored(full=full, quick=quick, failed=failed)


@pytest.fixture
def stored(database: Database) -> Stored:
    return _store(database)


@pytest.fixture
def config(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    # A fixed terminal width: the table cuts the response to fit it.
    monkeypatch.setenv("COLUMNS", "100")
    dataset = tmp_path / "arith.jsonl"
    dataset.write_text('{"id": "q1", "problem": "1+1", "answer": "2"}\n')
    return str(write_config(tmp_path, database_url, dataset=dataset))


def _samples(
    config: str, capsys: pytest.CaptureFixture[str], *args: str, code: int = 0
) -> tuple[list[str], list[str]]:
    assert main(["--config", config, "samples", "--run", "toy", *args]) == code
    out, err = capsys.readouterr()
    return out.splitlines(), err.splitlines()


def test_problems_are_stored_with_the_result_and_counted(database: Database, stored: Stored) -> None:
    with database.session() as s:
        counts = {(j.step, j.task, j.stage): j.problems for j in queries.job_rows(s, "toy")}
        found = queries.job_samples(s, run="toy", step=10, task="arith")
    # Stored results count their problems, 0 included; a pending or failed job has stored nothing.
    assert counts == {
        (10, "arith", "full"): 2,
        (10, "arith", "quick"): 0,
        (10, "gsm8k", "full"): None,
        (20, "arith", "full"): None,
        (20, "arith", "quick"): 0,
        (30, "arith", "quick"): 0,
    }
    assert (found.job_id, found.stage, found.checkpoint, found.stored) == (stored.full, "full", "step_10", 4)
    assert found.samples == FULL_SAMPLES
    assert found.problems == FULL_PROBLEMS


def test_table_shows_one_row_per_sample_then_the_problems(
    stored: Stored, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, _ = _samples(config, capsys, "--step", "10", "--task", "arith")
    assert lines[0] == (
        f"run toy, step 10 (step_10), task arith, stage full, job {stored.full}: 4 sample(s), 2 problem(s)"
    )
    assert lines[1].split() == [
        "index",
        "prompt_id",
        "correct",
        "reward",
        "tokens",
        "truncated",
        "extracted",
        "reference",
        "response",
    ]
    rows = lines[3:7]
    assert rows[0].split() == [
        "0",
        "q1",
        "yes",
        "1",
        "9",
        "no",
        "2",
        "2",
        "The",
        "answer",
        "is",
        "\\boxed{2}",
    ]
    assert rows[1].split() == ["1", "q1", "no", "0", "5", "no", "3", "2", "I", "think", "3"]
    # No extracted answer reads "-"; the 500-character response is flattened and cut to the width.
    assert rows[2].split()[:8] == ["2", "q2", "no", "0", "32", "yes", "-", "5"]
    assert rows[2].endswith("x…") and len(rows[2]) == 100
    assert rows[3].split() == ["3", "q2", "error", "-", "7", "no", "five", "5", "\\boxed{five}"]
    assert all(len(line) <= 100 for line in lines[1:7])
    assert lines[7:] == [
        "problem: data/arith.jsonl:3: invalid JSON: Expecting value",
        "problem: sample 3 (prompt q2): reward raised ValueError",
    ]


def test_json_has_every_field_of_every_sample_and_problem(
    stored: Stored, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, _ = _samples(config, capsys, "--step", "10", "--task", "arith", "--format", "json")
    out = json.loads("\n".join(lines))
    assert {
        k: out[k] for k in ("run", "step", "task", "stage", "job_id", "stored_samples", "wrong_only")
    } == {
        "run": "toy",
        "step": 10,
        "task": "arith",
        "stage": "full",
        "job_id": stored.full,
        "stored_samples": 4,
        "wrong_only": False,
    }
    assert out["samples"][3] == {
        "index": 3,
        "prompt_id": "q2",
        "prompt": "2+3=",
        "response": "\\boxed{five}",
        "extracted": "five",
        "reference": "5",
        "correct": False,
        "tokens": 7,
        "truncated": False,
        "reward": None,
        "entropy": 0.5,
        "error": "reward raised ValueError",
    }
    assert out["samples"][2]["response"] == "x" * 500 + "\nstill going"  # whole, unlike the table
    assert [(s["index"], s["reward"], s["entropy"]) for s in out["samples"]] == [
        (0, 1.0, 0.31),
        (1, 0.0, 0.92),
        (2, 0.0, 1.7),
        (3, None, 0.5),
    ]
    assert out["problems"] == [
        {
            "where": "data/arith.jsonl:3",
            "message": "invalid JSON: Expecting value",
            "prompt_id": None,
            "index": None,
        },
        {"where": "sample 3", "message": "reward raised ValueError", "prompt_id": "q2", "index": 3},
    ]


def test_wrong_only_leaves_out_the_right_and_the_errored(
    stored: Stored, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, _ = _samples(config, capsys, "--step", "10", "--task", "arith", "--wrong-only", "--format", "json")
    out = json.loads("\n".join(lines))
    assert [(s["index"], s["prompt_id"], s["correct"]) for s in out["samples"]] == [
        (1, "q1", False),
        (2, "q2", False),
    ]
    assert (out["wrong_only"], out["stored_samples"], len(out["problems"])) == (True, 4, 2)
    lines, _ = _samples(config, capsys, "--step", "10", "--task", "arith", "--wrong-only")
    assert lines[0].endswith(f"job {stored.full}: 2 wrong of 4 sample(s), 2 problem(s)")
    assert [line.split()[0] for line in lines[3:5]] == ["1", "2"]
    assert lines[5].startswith("problem: ")


def test_stage_is_full_where_it_ran_else_quick_unless_asked(
    stored: Stored, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lines, _ = _samples(config, capsys, "--step", "10", "--task", "arith", "--stage", "quick")
    assert lines[0] == (
        f"run toy, step 10 (step_10), task arith, stage quick, job {stored.quick}: 1 sample(s), 0 problem(s)"
    )
    assert lines[3].split() == ["0", "q7", "yes", "1", "2", "no", "7", "7", "7"]
    assert len(lines) == 4  # no problem lines
    lines, _ = _samples(config, capsys, "--step", "30", "--task", "arith", "--format", "json")
    out = json.loads("\n".join(lines))
    assert (out["stage"], [s["prompt_id"] for s in out["samples"]]) == ("quick", ["q7"])


def test_each_missing_thing_is_named_with_what_exists(
    stored: Stored, database: Database, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def error(*args: str) -> str:
        out, err = _samples(config, capsys, *args, code=1)
        assert out == [] and len(err) == 1
        return err[0]

    assert main(["--config", config, "samples", "--run", "nope", "--step", "10", "--task", "arith"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "evald: error: no run 'nope' in the database (runs: other, toy)"
    ]
    assert error("--step", "15", "--task", "arith") == (
        "evald: error: run 'toy' has no checkpoint at step 15 (steps: 10, 20, 30)"
    )
    assert error("--step", "10", "--task", "mbpp") == (
        "evald: error: run 'toy' has no job for task 'mbpp' at step 10 (jobs there: arith [full, quick], "
        "gsm8k [full])"
    )
    assert error("--step", "30", "--task", "arith", "--stage", "full") == (
        "evald: error: run 'toy' has no full job for task 'arith' at step 30 (jobs there: arith [quick])"
    )
    assert error("--step", "10", "--task", "gsm8k") == (
        f"evald: error: job {stored.failed} (gsm8k/full at step 10 of run 'toy') has not succeeded: it is "
        "failed (checkpoint_invalid: bad header in model.safetensors)"
    )
    pending = error("--step", "20", "--task", "arith")
    assert pending.endswith(
        "(arith/full at step 20 of run 'toy') has not succeeded: it is pending; its quick stage has succeeded"
    )
    lines, _ = _samples(config, capsys, "--step", "20", "--task", "arith", "--stage", "quick")
    assert "stage quick" in lines[0]


def test_a_missing_step_lists_the_nearest_of_many(database: Database) -> None:
    for step in range(100, 1100, 100):
        _job(database, "long", step, "arith", "full", samples=[])
    with database.session() as s, pytest.raises(queries.SamplesUnavailable) as caught:
        queries.job_samples(s, run="long", step=450, task="arith")
    assert str(caught.value) == (
        "run 'long' has no checkpoint at step 450 (nearest steps: 200, 300, 400, 500, 600 (of 10))"
    )


def test_status_counts_the_inputs_a_stored_result_left_out(
    stored: Stored, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", config, "status", "--format", "json"]) == 0
    toy = json.loads(capsys.readouterr().out)["runs"]["toy"]
    assert toy["left_out"] == [
        {"job": stored.full, "step": 10, "task": "arith", "stage": "full", "inputs": 2}
    ]
    assert main(["--config", config, "status"]) == 0
    assert (
        f"  left out:    step 10 [arith/full] (job {stored.full}): 2 input(s) with problems "
        "(see `evald samples`)"
    ) in capsys.readouterr().out.splitlines()


def test_upgrade_from_0003_keeps_samples_and_adds_the_details(database_url: str) -> None:
    """A database with results stored before 0004: its samples survive with no reward, entropy or error,
    its jobs have no problem count (unknown, not 0), and new results store all of them."""
    db = Database(database_url)
    migrations.upgrade(db, "0003")
    t0 = datetime(2026, 11, 1, tzinfo=UTC)
    old = Sample(0, "old", "1+1=", "2", "2", "2", True, 4, False)
    # The columns samples has at 0003: no reward, entropy or error yet (nor 0012's code-task columns).
    later = ("reward", "entropy", "error", "verdict", "tests_passed", "tests_total", "verdicts")
    sample = {k: v for k, v in asdict(old).items() if k not in (*later, "failed_test", "failed_output")}

    def insert(s: Session, table: str, **values: object) -> int:
        # Columns as revision 0003 has them, whatever the models say now; ids from the database, so that
        # PostgreSQL's sequences stay ahead of them.
        columns: list[sa.ColumnClause[Any]] = [
            sa.column(c, UTCDateTime()) if isinstance(v, datetime) else sa.column(c)
            for c, v in values.items()
        ]
        t = sa.table(table, sa.column("id"), *columns)
        return int(s.execute(sa.insert(t).values(**values).returning(t.c.id)).scalar_one())

    with db.session() as s:
        run_id = insert(s, "runs", name="r", root="/runs/r", created_at=t0)
        checkpoint_id = insert(
            s,
            "checkpoints",
            run_id=run_id,
            path="/runs/r/step_10",
            name="step_10",
            step=10,
            layout="hf",
            state="ready",
            discovered_at=t0,
            updated_at=t0,
        )
        job_id = insert(
            s,
            "eval_jobs",
            checkpoint_id=checkpoint_id,
            task="arith",
            stage="full",
            state="succeeded",
            priority=0,
            step=10,
            attempts=1,
            created_at=t0,
        )
        insert(s, "samples", job_id=job_id, **sample)
    migrations.upgrade(db)
    try:
        with db.session() as s:
            found = queries.job_samples(s, run="r", step=10, task="arith")
            (job,) = queries.job_rows(s, "r")
        assert found.samples == [old] and found.problems == []
        assert found.samples[0].reward is None and job.problems is None
        # The upgrade kept one sample row per job × index.
        with pytest.raises(IntegrityError), db.session() as s:
            insert(s, "samples", job_id=job_id, **sample)
        _job(db, "r", 20, "arith", "full", samples=FULL_SAMPLES[:1], problems=FULL_PROBLEMS[1:])
        with db.session() as s:
            new = queries.job_samples(s, run="r", step=20, task="arith")
            counts = {j.step: j.problems for j in queries.job_rows(s, "r")}
        assert (new.samples, new.problems, counts) == (FULL_SAMPLES[:1], FULL_PROBLEMS[1:], {10: None, 20: 1})
        # Problems go with their job.
        with db.session() as s:
            s.execute(sa.text("DELETE FROM eval_jobs WHERE step = 20"))
        with db.session() as s:
            assert s.scalar(sa.text("SELECT count(*) FROM sample_problems")) == 0
    finally:
        db.dispose()


FAKE_WORKER = """#!{python}
# Stands in for `python -m inference.worker SPEC`: hands the daemon the result the test prepared.
import json, shutil, sys
spec = json.load(open(sys.argv[-1]))
shutil.copy({prepared!r}, spec["result_path"])
"""


def _drive(runner: JobRunner, timeout: float = 60) -> None:
    """The daemon's loop, reduced to the runner: claim, poll, until the queue is empty."""
    deadline = Deadline(timeout)
    while not deadline.expired():
        runner.poll()
        if not runner.running and not runner.claim_and_start():
            return
        time.sleep(0.05)
    raise AssertionError("the job did not end in time")


def test_runner_stores_a_workers_sample_details_and_warns_of_its_problems(
    database: Database, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "run" / "step_10"
    checkpoint.mkdir(parents=True)
    problems = tuple(
        Problem(where=f"data/arith.jsonl:{n}", message=f"line {n}: no answer") for n in range(1, 8)
    )
    result = JobResult(
        job_id=0,
        metrics=(MetricValue(name="accuracy", value=0.5, n=2, stderr=0.35),),
        samples=tuple(SampleOutput(**vars(s)) for s in FULL_SAMPLES),
        problems=(
            *problems,
            Problem(where="sample 3", message="reward raised\nValueError", prompt_id="q2", index=3),
        ),
        timing=Timing(load_s=0.1, eval_s=0.2, total_s=0.3, grading_s=0.05),
    )
    prepared = tmp_path / "prepared.json"
    result.write(prepared)
    python = tmp_path / "fake-python"
    python.write_text(FAKE_WORKER.format(python=sys.executable, prepared=str(prepared)))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    dataset = tmp_path / "arith.jsonl"
    dataset.write_text('{"id": "q1", "problem": "1+1", "answer": "2"}\n')
    config = Config(
        runs=(RunConfig(name="r", root=tmp_path / "run"),),
        tasks=(TaskConfig(name="arith", dataset=dataset),),
        inference=InferenceConfig(python=python, engine="hf"),
        daemon=DaemonConfig(state_dir=tmp_path / "state"),
    )
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(tmp_path / "run"))
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=str(checkpoint),
            name="step_10",
            step=10,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=10, tasks=["arith"])
    with structlog.testing.capture_logs() as logs:
        _drive(JobRunner(config, database, "test:1"))
    with database.session() as s:
        found = queries.job_samples(s, run="r", step=10, task="arith")
        (job,) = queries.job_rows(s, "r")
    assert (job.state, job.problems) == ("succeeded", 8)
    assert found.samples == FULL_SAMPLES
    assert found.problems[-1] == queries.ProblemRow("sample 3", "reward raised\nValueError", "q2", 3)
    assert [p.where for p in found.problems[:7]] == [f"data/arith.jsonl:{n}" for n in range(1, 8)]
    (warning,) = [e for e in logs if e["event"] == "job.problems"]
    assert warning["log_level"] == "warning"
    assert (warning["job_id"], warning["count"], warning["task"]) == (job.id, 8, "arith")
    assert warning["first"] == [f"data/arith.jsonl:{n}: line {n}: no answer" for n in range(1, 6)]
