"""Scheduling end to end: the real daemon, real worker processes, real checkpoint folders, SIGKILL, and
the GPU readings of a fake NVML (the one part that cannot exist here)."""

from __future__ import annotations

import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select

from storage import queries
from storage import scheduling as store
from storage.database import Database
from storage.models import EvalJob
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.fakes.nvml_state import FakeGpu, FakeNvml
from tests.forkserver import PYTHON_OVERRIDE_ENV
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    evald,
    jobs,
    log_events,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "arith.jsonl", 8)


def _plans(database: Database) -> dict[int | None, tuple[str, str | None]]:
    with database.session() as session:
        return {p.step: (p.plan, p.reason) for p in store.plan_rows(session)}


def _planned(database: Database, step: int) -> bool:
    return step in _plans(database)


def _kill(daemon: DaemonProcess) -> None:
    daemon.stop(signal.SIGKILL)


@pytest.mark.long
def test_kill_9_between_checkpoints_evaluates_the_same_checkpoints(
    database_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    """Checkpoints every 10 steps, freq_steps = 20; the daemon is killed with SIGKILL twice, once while
    a checkpoint appears and once with a job running. Exactly 20, 40 and 60 are evaluated, once each."""
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=dataset, run_extra="freq_steps = 20")
    root = tmp_path / "run"
    log = tmp_path / "daemon.log"

    def save(step: int) -> None:
        copy_checkpoint(toy_run.last_checkpoint, root / f"step_{step}")

    daemon = DaemonProcess(config, log)
    daemon.wait_ready()
    # Each save waits for the one before it to be planned, as a trainer's saves minutes apart are: two
    # saved at once may settle in either order, and the later one planned first says so in the other's
    # reason ("ready after step 20 was planned").
    save(10)
    wait_for(lambda: _planned(database, 10), 60, "step 10 planned", daemon.process)
    save(20)
    wait_for(lambda: _planned(database, 20), 60, "step 20 planned", daemon.process)
    _kill(daemon)
    save(30)  # written while no daemon runs
    daemon = DaemonProcess(config, log)
    daemon.wait_ready()
    wait_for(lambda: _planned(database, 30), 60, "step 30 planned", daemon.process)
    save(40)
    wait_for(lambda: _planned(database, 40), 60, "step 40 planned", daemon.process)
    wait_for(lambda: any(j.state == "running" for j in jobs(database)) or None, 60, "a running job")
    _kill(daemon)  # mid-job: the job is redone, not lost and not doubled
    daemon = DaemonProcess(config, log)
    daemon.wait_ready()
    save(50)
    wait_for(lambda: _planned(database, 50), 60, "step 50 planned", daemon.process)
    save(60)
    rows = wait_for(
        lambda: all_jobs_done(database, 3) if _planned(database, 60) else None, 180, "three jobs done"
    )
    assert daemon.stop() == 0

    plans = _plans(database)
    assert [s for s, (plan, _) in plans.items() if plan == "due"] == [20, 40, 60]
    assert plans[10] == ("skipped", "not due: 10 steps since step 0, freq_steps=20")
    assert plans[30] == ("skipped", "not due: 10 steps since step 20, freq_steps=20")
    assert plans[50] == ("skipped", "not due: 10 steps since step 40, freq_steps=20")
    assert sorted((j.step, j.state) for j in rows) == [
        (20, "succeeded"),
        (40, "succeeded"),
        (60, "succeeded"),
    ]

    status = evald("--config", str(config), "status")
    assert status.returncode == 0, status.stderr
    assert "skipped:     step_50: not due: 10 steps since step 40, freq_steps=20" in status.stdout
    assert "next due:    step >= 80" in status.stdout
    database.dispose()


def test_time_trigger_evaluates_the_newest_checkpoint_at_its_tick(
    sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=dataset, run_extra="freq_secs = 8")
    root = tmp_path / "run"
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        copy_checkpoint(toy_run.last_checkpoint, root / "step_10")
        wait_for(lambda: _planned(database, 10), 30, "step 10 planned", daemon.process)
        copy_checkpoint(toy_run.last_checkpoint, root / "step_20")
        wait_for(
            lambda: _plans(database).get(20, ("",))[0] == "due" or None,
            30,
            "the time trigger",
            daemon.process,
        )
        rows = wait_for(lambda: all_jobs_done(database, 1), 120, "the job", daemon.process)
        assert daemon.stop() == 0
    plans = _plans(database)
    # Step 10 is ready about a second after the start, well before the first tick at 8 s.
    assert plans[10] == ("skipped", "not due: superseded by step 20 (the time trigger takes the newest)")
    assert plans[20][1] is not None and plans[20][1].startswith("time trigger: ")
    assert [(j.step, j.state) for j in rows] == [(20, "succeeded")]
    database.dispose()


def test_unmet_gpu_threshold_defers_until_met_then_starts_within_one_recheck(
    sqlite_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    """The fake NVML reports a busy GPU: nothing starts, the job is deferred with the unmet threshold and
    reported stuck past its limit. Once the GPU frees up, the job starts within one re-check interval."""
    recheck = 1.5
    database = upgraded(sqlite_url)
    nvml = FakeNvml(tmp_path / "fake_nvml.json")
    nvml.set(gpus=[FakeGpu(free_mib=2048, util=97)])
    config = write_config(
        tmp_path,
        sqlite_url,
        dataset=dataset,
        # The job is meant for a GPU; this machine has none, so once started it fails, which is fine here:
        # what is tested is when it starts.
        inference_extra='device = "cuda"',
        scheduling_extra=(
            f"recheck_secs = {recheck}\nstuck_after_secs = 1.0\nhousekeeping_secs = 0.5\n"
            '[scheduling.resources]\nmin_gpu_free_memory = "20GiB"\nmax_gpu_utilization = "90%"'
        ),
    )
    log = tmp_path / "daemon.log"
    # The worker's "interpreter" fails at once (``[inference] python``, which the session sets through this
    # variable to its fork server's shim): a real one would spend 6 CPU-s importing torch in a fresh process
    # (the fork server declines CUDA jobs) only to fail too.
    env = {**nvml.subprocess_env(os.environ), PYTHON_OVERRIDE_ENV: "/bin/false"}
    with running_daemon(config, log, env=env) as daemon:
        copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
        wait_for(lambda: [j for j in jobs(database) if j.state == "deferred"] or None, 60, "a deferred job")
        wait_for(lambda: log_events(log, "job.stuck") or None, 30, "the stuck event", daemon.process)
        assert log_events(log, "job.started") == []
        (job,) = jobs(database)
        assert job.wait_reason == (
            "gpu 0: free memory 2.0 GiB < min_gpu_free_memory 20.0 GiB; "
            "gpu 0: utilization 97% > max_gpu_utilization 90%"
        )
        status = evald("--config", str(config), "status")
        assert f"deferred:    step 10 [arith/full]: {job.wait_reason}" in status.stdout
        with database.session() as session:
            (stuck,) = store.events(session, kinds=["stuck"])
        assert stuck.run == "toy" and "deferred for" in stuck.message

        freed = time.time()
        nvml.set(gpus=[FakeGpu(util=3)])
        started = wait_for(
            lambda: log_events(log, "job.started") or None, 30, "the job to start", daemon.process
        )
        delay = datetime.fromisoformat(str(started[0]["timestamp"])).timestamp() - freed
        assert delay <= recheck + 0.5, delay
        assert daemon.stop() == 0
    database.dispose()


@pytest.mark.long
def test_two_stage_stores_quick_and_full_results_separately(
    database_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    """Every due checkpoint gets a quick stage on a fixed 4-item subset; the 1st and 3rd planned also the
    full 8 items. The same weights at every step: no new best and no anomaly, so no other full stage."""
    database = upgraded(database_url)
    config = write_config(
        tmp_path,
        database_url,
        dataset=dataset,
        scheduling_extra="[scheduling.two_stage.arith]\nquick_size = 4\nfull_every = 2\nseed = 5",
    )
    # All three are there at the start, so they are planned together and the queue order shows.
    for step in (10, 20, 30):
        copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / f"step_{step}")
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        rows = wait_for(lambda: all_jobs_done(database, 5), 180, "five jobs", daemon.process)
        assert daemon.stop() == 0
    # full_every counts checkpoints in the order they were planned: each is planned once it is ready, so
    # the three (written at once) may be planned in any order; the 1st and 3rd planned get the full stage.
    planned = [j.step or 0 for j in sorted(rows, key=lambda j: j.id) if j.stage == "quick"]
    assert sorted(planned) == [10, 20, 30]
    full = {planned[0], planned[2]}
    assert sorted((j.step, j.stage, j.state) for j in rows) == sorted(
        [(step, "quick", "succeeded") for step in planned] + [(step, "full", "succeeded") for step in full]
    )
    with database.session() as session:
        accuracy = [r for r in queries.result_rows(session, metric="accuracy")]
    assert {(r.step, r.stage, r.n) for r in accuracy} == {(step, "quick", 4) for step in planned} | {
        (step, "full", 8) for step in full
    }
    quick = {r.value for r in accuracy if r.stage == "quick"}
    assert len(quick) == 1  # the same items at every checkpoint, the same weights: the same score
    with database.session() as session:
        started = sorted((j.started_at, j.stage) for j in session.scalars(select(EvalJob)))
    assert [stage for _, stage in started] == ["quick", "quick", "quick", "full", "full"]
    database.dispose()
