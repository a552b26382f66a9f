"""Deferral in the job runner: the real runner and database, GPU readings from the fake NVML."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from daemon.config import Config, InferenceConfig, RunConfig, SchedulingConfig, TaskConfig
from daemon.running.runner import JobRunner
from daemon.scheduling.resources import ResourceProbe, Thresholds
from storage import queries
from storage.database import Database
from storage.models import CheckpointState, EvalJob, JobState
from tests.fakes.nvml_state import FakeGpu, FakeNvml


def _config(tmp_path: Path) -> Config:
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"problem": "1+1", "answer": "2"}\n')
    return Config(
        runs=(RunConfig(name="r", root=tmp_path / "run"),),
        tasks=(TaskConfig(name="arith", dataset=dataset),),
        inference=InferenceConfig(device="cuda"),
        scheduling=SchedulingConfig(stuck_after_secs=60),
    )


def _pending_job(database: Database) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", "/runs/r")
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/runs/r/step_10",
            name="step_10",
            step=10,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=10, tasks=["arith"])


def _states(database: Database) -> list[tuple[str, str | None]]:
    with database.session() as s:
        return [(j.state, j.wait_reason) for j in queries.job_rows(s)]


def test_unmet_threshold_defers_then_releases_and_reports_stuck(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nvml = FakeNvml.install(tmp_path, monkeypatch)
    nvml.set(gpus=[FakeGpu(free_mib=1024), FakeGpu()])
    probe = ResourceProbe(Thresholds(min_gpu_free_bytes=8 * 2**30), uses_gpu=True, gpu_indices=None)
    runner = JobRunner(_config(tmp_path), database, "test:1", probe=probe)
    _pending_job(database)

    assert runner.claim_and_start() is False  # nothing starts
    reason = "gpu 0: free memory 1.0 GiB < min_gpu_free_memory 8.0 GiB"
    assert _states(database) == [("deferred", reason)]
    assert runner.recheck_deferred() == 0
    assert runner.report_stuck() == 0

    with database.session() as s:  # an hour passes while it waits
        for job in s.scalars(select(EvalJob)):
            assert job.deferred_at is not None
            job.deferred_at -= timedelta(hours=1)
    assert runner.report_stuck() == 1
    assert runner.report_stuck() == 0  # reported once

    nvml.set(gpus=[FakeGpu(), FakeGpu()])
    assert runner.recheck_deferred() == 1
    assert [state for state, _ in _states(database)] == ["pending"]


def test_without_thresholds_leftover_deferred_jobs_are_released(database: Database, tmp_path: Path) -> None:
    _pending_job(database)
    with database.session() as s:
        s.execute(update(EvalJob).values(state=JobState.DEFERRED, wait_reason="a threshold since removed"))
    runner = JobRunner(_config(tmp_path), database, "test:1", probe=None)
    assert runner.recheck_deferred() == 1
    assert [state for state, _ in _states(database)] == ["pending"]


def test_a_deferred_job_is_claimed_once_this_node_has_the_resources(database: Database) -> None:
    """Deferral says why one node could not start; on a shared queue another node with free GPUs (or
    this one, once its check passes) claims the job without waiting for a release."""
    _pending_job(database)
    with database.session() as s:
        s.execute(update(EvalJob).values(state=JobState.DEFERRED, wait_reason="gpu 0 busy on node a"))
    with database.session() as s:
        job = queries.claim_next_job(s, "node-b:1")
    assert job is not None and job.step == 10
    assert _states(database) == [("running", None)]
