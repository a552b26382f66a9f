"""A crashed worker's error says why it died (issue 31): its first line is the cause (the exception of
the last traceback, the error event of its log, or the exit signal), which is all ``evald status`` shows;
the log's tail follows below it, for ``evald history``. Each log here is written by a real process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from sqlalchemy import select

from daemon.analysis import report
from daemon.running import remote
from daemon.running.executors.base import Ended, EndKind
from daemon.running.workers import crash_cause, read_outcome
from inference.spec import JobSpec, TaskSpec
from storage import queries
from storage.database import Database
from storage.models import CheckpointState, EvalJob
from tests.deadlines import patient

#: A worker's start as the daemon sees it: its JSON lines, then what ends it.
_PROLOGUE = """
import structlog
from inference.worker import configure_logging

configure_logging()
log = structlog.get_logger("inference.worker")
log.info("worker.started", checkpoint="/ckpt/step_30", task="arith")
log.info("task.loaded", load_s=0.5, items=8, rank=0)
"""


def _run(tmp_path: Path, body: str) -> tuple[int, Path]:
    log = tmp_path / "worker.log"
    script = _PROLOGUE + textwrap.dedent(body)
    with log.open("wb") as out:
        code = subprocess.run(
            [sys.executable, "-c", script], stdout=out, stderr=out, timeout=patient(60)
        ).returncode
    return code, log


def _spec(tmp_path: Path) -> JobSpec:
    return JobSpec(
        job_id=1,
        checkpoint_path=tmp_path / "ckpt",
        task=TaskSpec(name="arith", dataset=tmp_path / "d.jsonl"),
        result_path=tmp_path / "result.json",
    )


def test_a_traceback_gives_its_exception_line(tmp_path: Path) -> None:
    code, log = _run(
        tmp_path,
        """
        def grade():
            raise KeyError("answer")
        try:
            grade()
        except KeyError as exc:
            raise RuntimeError("the grader lost its table") from exc
        """,
    )

    outcome = read_outcome(_spec(tmp_path), code, log)

    assert outcome.error_kind == "crash"
    first, _, rest = outcome.error.partition("\n")
    assert first == "worker exit status 1: RuntimeError: the grader lost its table"
    assert '"task.loaded"' in rest and "KeyError" in rest  # the tail, for history


def test_an_error_event_without_a_traceback_is_the_cause(tmp_path: Path) -> None:
    code, log = _run(
        tmp_path,
        """
        import os
        log.error("group.peer_lost", error="rank 1 stopped answering in all_gather")
        log.info("group.closing")
        os._exit(7)
        """,
    )

    first = read_outcome(_spec(tmp_path), code, log).error.splitlines()[0]

    assert first == "worker exit status 7: group.peer_lost: rank 1 stopped answering in all_gather"


def test_a_signal_with_nothing_in_the_log_says_so(tmp_path: Path) -> None:
    code, log = _run(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    assert code == -signal.SIGKILL

    first = read_outcome(_spec(tmp_path), code, log).error.splitlines()[0]

    assert first == "worker killed by SIGKILL, with no error in its log"
    assert crash_cause(log.read_text()) is None


def test_a_native_crash_gives_faulthandlers_line(tmp_path: Path) -> None:
    code, log = _run(tmp_path, "import faulthandler, ctypes\nfaulthandler.enable()\nctypes.string_at(0)\n")

    first = read_outcome(_spec(tmp_path), code, log).error.splitlines()[0]

    assert first.startswith("worker killed by SIGSEGV: Fatal Python error: Segmentation fault"), first


def test_a_slurm_jobs_log_tail_gives_its_exception(tmp_path: Path) -> None:
    code, log = _run(tmp_path, 'raise ValueError("bad batch")\n')
    tail = "\n".join(log.read_text().splitlines()[-3:])  # the scheduler's tail: the traceback's start cut off
    ended = Ended(EndKind.FAILED, "Slurm job 9 FAILED on node3: exit status 1", exit_code=code, log_tail=tail)

    error = remote.outcome_of(ended, _spec(tmp_path)).error

    assert error.splitlines()[0] == "Slurm job 9 FAILED on node3: exit status 1: ValueError: bad batch"


def test_status_shows_the_cause_and_history_the_log(database: Database, tmp_path: Path) -> None:
    code, log = _run(tmp_path, 'raise ValueError("bad batch")\n')
    error = read_outcome(_spec(tmp_path), code, log).error
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(tmp_path))
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=str(tmp_path / "step_30"),
            name="step_30",
            step=30,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=30, tasks=["arith"])
    with database.session() as s:
        job = queries.claim_next_job(s, "test:1")
        assert job is not None
        queries.fail_job(s, job_id=job.id, owner="test:1", kind="crash", error=error, duration_s=1.0)

    with database.session() as s:
        summary = report.status(queries.checkpoint_rows(s), queries.job_rows(s), ["r"])
    text = report.status_text(summary)
    (line,) = [line for line in text.splitlines() if "step_30 [arith]" in line]
    assert line.endswith("worker exit status 1: ValueError: bad batch")
    assert "task.loaded" not in text
    with database.session() as s:
        stored = s.scalar(select(EvalJob.error).where(EvalJob.id == job.id))
    assert stored == error and '"task.loaded"' in stored  # the whole text is kept for the record
