"""A job's attempts in the dashboard, in a real browser (Debian's Chromium driven by Playwright): a click
on a point opens its checkpoint's jobs, and a job retried with ``evald retry`` after a Slurm TIMEOUT
shows both attempts (Slurm job ids, nodes, queue wait, exit state, the error's first line and the whole
text a click away), read from ``/api/v1/jobs/{job}`` of an ``evald serve`` process. The runs are
tests/dashboard_data.py's, plus that retried job stored through the real claim, retry and outcome
functions. Skipped as tests/test_web_browser.py skips where no browser is installed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from daemon.running.executors.base import Handle
from storage import queries
from storage.database import Database
from storage.models import CheckpointState, EvalJob
from storage.queries.retry import retry_job_rows
from tests import dashboard_data
from tests.web_pages import browser, serving, shots, sign_in

__all__ = ["browser"]  # the module's fixture, bound here

pytestmark = pytest.mark.slow

RUN = "grpo-s1"
#: The retried job's step: one past the runs' last, so its point is the newest.
STEP = dashboard_data.STEPS[-1] + 10
OWNER = "login1:7001"
TIMEOUT_ERROR = (
    "Slurm job 9001 TIMEOUT on gpu-node3 after 1800 s (time limit 30 min)\n"
    "--- the worker's log, last lines ---\n"
    '{"event": "task.loaded", "task": "math"}\n'
    '{"event": "generation.batch", "batch": 41}'
)
ACC = f'.chart[data-chart="{dashboard_data.TASK}/full/accuracy"]'
ROWS = '#detail-jobs details.job[data-job="{job}"] table.attempts tbody tr.attempt'


@dataclass(frozen=True)
class Served:
    url: str
    token: str
    job: int


def _retried_job(url: str) -> int:
    """A job of ``RUN`` at ``STEP`` as a Slurm daemon leaves it: submitted (Slurm 9001), pending, run on
    gpu-node3 until its TIMEOUT; queued again by ``evald retry``; claimed again, run as Slurm 9002 on
    gpu-node1 and stored."""
    database = Database(url)
    try:
        with database.session() as s:
            run_id = queries.ensure_run(s, RUN, f"/ckpt/{RUN}")
            checkpoint = queries.record_checkpoint(
                s,
                run_id=run_id,
                path=f"/ckpt/{RUN}/step_{STEP}",
                name=f"step_{STEP}",
                step=STEP,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=STEP, tasks=[dashboard_data.TASK])
        with database.session() as s:
            job = queries.claim_next_job(s, OWNER)
            assert job is not None and job.step == STEP
            handle = Handle("slurm", job.id, 1, Path(f"/state/jobs/{job.id}-1"), "9001")
            assert queries.record_handle(s, job_id=job.id, owner=OWNER, attempt=1, handle=handle.to_json())
            assert queries.set_executor_state(
                s, job_id=job.id, owner=OWNER, attempt=1, state="RUNNING on gpu-node3"
            )
        started = dashboard_data.stored_at(RUN, STEP)
        with database.session() as s:
            assert queries.fail_job(
                s, job_id=job.id, owner=OWNER, kind="timeout", error=TIMEOUT_ERROR, duration_s=1842.0
            )
            queries.record_attempt(
                s, _attempt(job.id, 1, "failed", TIMEOUT_ERROR, started, ("9001", "gpu-node3"))
            )
        with database.session() as s:
            (retried,) = retry_job_rows(s, job_id=job.id)
            assert retried.outcome == "queued"
        with database.session() as s:
            again = queries.claim_next_job(s, OWNER)
            assert again is not None and (again.id, again.attempts) == (job.id, 2)
            later = started + timedelta(hours=1)
            queries.record_attempt(s, _attempt(job.id, 2, "succeeded", None, later, ("9002", "gpu-node1")))
            assert queries.complete_job(
                s,
                job_id=job.id,
                owner=OWNER,
                metrics=dashboard_data.metrics_at(RUN, STEP),
                samples=[],
                duration_s=95.0,
                load_s=4.0,
                attempt=2,
            )
            s.execute(update(EvalJob).where(EvalJob.id == job.id).values(finished_at=later))
        return job.id
    finally:
        database.dispose()


def _attempt(
    job: int, attempt: int, outcome: str, error: str | None, started: Any, slurm: tuple[str, str]
) -> queries.AttemptRow:
    failed = error is not None
    return queries.AttemptRow(
        job_id=job,
        attempt=attempt,
        engine="hf",
        tp=2,
        dp=1,
        batch_size=16,
        outcome=outcome,
        error_kind="timeout" if failed else None,
        error=error,
        started_at=started,
        finished_at=started + timedelta(seconds=1842 if failed else 95),
        duration_s=1842.0 if failed else 95.0,
        slurm_job_id=slurm[0],
        nodes=slurm[1],
        queue_wait_s=42.0 if failed else 7.0,
        run_s=1800.0 if failed else 88.0,
        exit_state="TIMEOUT" if failed else "COMPLETED",
    )


@pytest.fixture(scope="module")
def served(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    data = dashboard_data.build(tmp_path_factory.mktemp("attempts"))
    job = _retried_job(data.url)
    with serving(data.config, token=data.token) as served:
        yield Served(served.url, data.token, job)


def _cells(page: Any, job: int) -> list[dict[str, str]]:
    """Each attempt's cells by column, and ``error``: the line under it (its summary, if it folds)."""
    rows: list[dict[str, str]] = page.eval_on_selector_all(
        ROWS.format(job=job),
        """rows => rows.map(r => {
            const cells = Object.fromEntries([...r.closest('table').querySelectorAll('th')]
                .map((th, i) => [th.textContent, r.children[i].textContent]));
            const next = r.nextElementSibling;
            const error = next && next.classList.contains('error-row') ? next.querySelector('td') : null;
            cells.error = error ? (error.querySelector('summary') || error).textContent : '–';
            return cells;
        })""",
    )
    return rows


def test_a_points_jobs_show_their_attempts_retries_and_slurm_placement(
    browser: Any, served: Served, tmp_path: Path
) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    try:
        page.goto(served.url + "login")
        sign_in(page, served.url, served.token)
        page.goto(f"{served.url}#runs={RUN}")
        page.wait_for_selector("body[data-ready=true]")
        page.wait_for_selector(f"{ACC} polyline.line", state="attached")

        # The retried job's point: its job opens at once (two attempts), both rows read from the API.
        page.locator(f'{ACC} circle.pt[data-run="{RUN}"][data-step="{STEP}"]').click()
        page.wait_for_function(
            "sel => document.querySelectorAll(sel).length === 2", arg=ROWS.format(job=served.job)
        )
        summary = page.inner_text(f'#detail-jobs details.job[data-job="{served.job}"] > summary')
        assert summary == f"job {served.job} · {dashboard_data.TASK}/full · succeeded · 2 attempts"
        first, second = _cells(page, served.job)
        assert (first["attempt"], first["outcome"], first["slurm job"], first["nodes"]) == (
            "1",
            "failed",
            "9001",
            "gpu-node3",
        )
        assert (first["queue wait"], first["exit state"], first["took"]) == ("42 s", "TIMEOUT", "30m 42s")
        # The error's first line, the log tail left out until asked for.
        assert first["error"] == (
            "timeout: Slurm job 9001 TIMEOUT on gpu-node3 after 1800 s (time limit 30 min) (3 more lines)"
        )
        assert (second["outcome"], second["slurm job"], second["nodes"], second["exit state"]) == (
            "succeeded",
            "9002",
            "gpu-node1",
            "COMPLETED",
        )
        assert (second["queue wait"], second["error"]) == ("7.0 s", "–")
        tail = page.locator(
            f'#detail-jobs details.job[data-job="{served.job}"] tr.error-row details.error-more'
        )
        assert not tail.locator("pre").is_visible()
        tail.locator("summary").click()
        assert '"generation.batch"' in tail.locator("pre").inner_text()
        # The log tail opened does not stretch the table: it fits the detail panel, unscrolled.
        fits = page.eval_on_selector(
            f'#detail-jobs details.job[data-job="{served.job}"] .table-wrap',
            "w => w.scrollWidth <= w.clientWidth + 1",
        )
        assert fits
        shot = shots(tmp_path) / "attempts.png"
        page.locator("#detail-jobs").screenshot(path=str(shot))
        page.screenshot(path=str(shots(tmp_path) / "attempts-page.png"))
        assert shot.stat().st_size > 5_000

        # A job that ran once and succeeded stays folded; a click opens its one attempt.
        page.locator(f'{ACC} circle.pt[data-run="{RUN}"][data-step="{STEP - 10}"]').click()
        page.wait_for_selector("#detail-title >> text=step " + str(STEP - 10))
        folded = page.locator("#detail-jobs details.job")
        folded.first.wait_for()
        assert folded.count() == 1 and folded.first.get_attribute("open") is None
        other = int(folded.first.get_attribute("data-job") or 0)
        folded.first.locator("summary").click()
        page.wait_for_selector(f"#detail-jobs details.job[data-job='{other}'] p.muted >> text=no worker run")
        api = httpx.get(
            f"{served.url}api/v1/jobs/{other}",
            headers={"Authorization": f"Bearer {served.token}"},
            timeout=10,
        ).json()
        assert api["attempts"] == [] and api["job"]["state"] == "succeeded"
        assert not errors, errors
    finally:
        context.close()
