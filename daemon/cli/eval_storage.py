"""What ``evald eval --store`` writes: each task's result as the daemon's job for that run, step and task.

The same statements a daemon's job goes through, in one transaction a task: the run and the checkpoint
recorded (as discovery records them: its path under the run root, its step read by its layout), the job
enqueued, claimed and completed (results, samples, problems, ``succeeded``, the result series) and its
history row. A job that has succeeded already is left as it is (storing the same run, step and task
again adds nothing); one a daemon is running now is not taken from it. Anomaly detection, alerts and the
planner's follow-ups are the daemon's, at its next result of the run: the CLI sends nothing.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from daemon.cli.base import open_current
from daemon.config import Config, RunConfig
from daemon.errors import ConfigError, EvaldError
from daemon.scheduling import stages
from inference.spec import JobResult, JobSpec
from storage import queries
from storage.database import Database
from storage.models import CheckpointState, JobState


@dataclass(frozen=True)
class Place:
    """Where a checkpoint's results are stored: its run, and the checkpoint as discovery records it."""

    run: RunConfig
    #: The folder under the run root (the run root joined with the checkpoint's path under it).
    path: Path
    #: Its path under the run root (``step_400``, ``_actor/global_step7``).
    name: str
    step: int
    epoch: int | None
    layout: str


@dataclass(frozen=True)
class Evaluated:
    """One task's evaluation by ``evald eval``: the worker's spec and result, and when it ran."""

    task: str
    spec: JobSpec
    result: JobResult
    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True)
class Stored:
    """What ``--store`` did with one task's result: ``added``, or the job had succeeded already."""

    task: str
    job_id: int
    added: bool
    run: str
    step: int
    #: The checkpoint's name in its run (its path under the run root).
    checkpoint: str

    def line(self) -> str:
        at = f"run {self.run!r}, step {self.step} ({self.checkpoint}), task {self.task!r}"
        if self.added:
            return f"stored: {at} as job {self.job_id}"
        return f"already stored: {at} (job {self.job_id}): nothing added"

    def as_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "run": self.run,
            "step": self.step,
            "checkpoint": self.checkpoint,
            "job": self.job_id,
            "added": self.added,
        }


def place(config: Config, checkpoint: Path, layout: str, run_name: str | None) -> Place:
    """Where ``checkpoint`` (read as ``layout``) is stored: under ``run_name``, or the configured run whose
    root holds it; :class:`EvaldError` naming the fix when no run can be told or its step cannot be read."""
    from daemon.watching.folders import step_of

    run = _run(config, checkpoint, run_name)
    if checkpoint.resolve() == run.root.resolve():
        raise EvaldError(
            f"--store: {checkpoint} is run {run.name!r}'s root itself, which the daemon never evaluates: "
            "not stored (save the model into a sub-folder of the root, final/ or checkpoint-N/)"
        )
    path, name = _under(run.root, checkpoint)
    step, epoch, problem = step_of(path, layout)
    if step is None:
        why = problem or f"{name!r} names no step"
        raise EvaldError(f"--store: {checkpoint}: {why}; the daemon would not store it either")
    return Place(run, path, name, step, epoch, layout)


def _run(config: Config, checkpoint: Path, run_name: str | None) -> RunConfig:
    known = ", ".join(r.name for r in config.runs) or "none"
    if run_name is not None:
        run = config.run(run_name)
        if run is None:
            raise ConfigError("--run", [f"no run {run_name!r} in the config (runs: {known})"])
        return run
    real = checkpoint.resolve()
    holding = [r for r in config.runs if real.is_relative_to(r.root.resolve())]
    if not holding:
        raise EvaldError(
            f"--store: {checkpoint} is under no configured run's root (runs: {known}): "
            "name the run with --run"
        )
    # Nested roots: the innermost holds it.
    return max(holding, key=lambda r: len(r.root.resolve().parts))


def _under(root: Path, checkpoint: Path) -> tuple[Path, str]:
    """The checkpoint as discovery names it: the run root joined with its path under the root (symlinks
    in the root's own path kept as configured), or, outside the root, its own path and folder name."""
    real, real_root = checkpoint.resolve(), root.resolve()
    if real.is_relative_to(real_root):
        relative = real.relative_to(real_root)
        return root / relative, str(relative)
    return real, real.name


def task_names(config: Config, task: str | None, run: RunConfig | None) -> list[str]:
    """The tasks to evaluate: ``task``, or every configured one; with a run to store under, only its
    own (a task it does not evaluate would leave a result the daemon never adds to)."""
    if task is not None and config.task(task) is None:
        defined = ", ".join(t.name for t in config.tasks)
        raise ConfigError("--task", [f"unknown task {task!r} (defined: {defined})"])
    own = [t.name for t in (config.tasks_for(run) if run is not None else config.tasks)]
    if task is None:
        return own
    if task not in own and run is not None:
        problem = f"task {task!r} is not one of run {run.name!r}'s tasks ({', '.join(own)}): not stored"
        raise ConfigError("--task", [problem])
    return [task]


class Keeper:
    """Stores each task's result as it comes, under ``where`` (``--store``); without one, nothing. The
    database is opened (and its schema checked) first, before any worker runs."""

    def __init__(self, config: Config, where: Place | None) -> None:
        self.where = where
        self.stored: list[Stored] = []
        self._database = open_current(config.database.url) if where is not None else None

    def keep(self, evaluated: Evaluated) -> None:
        if self._database is not None and self.where is not None:
            self.stored.append(store(self._database, self.where, evaluated))

    def __enter__(self) -> Keeper:
        return self

    def __exit__(self, *_: object) -> None:
        if self._database is not None:
            self._database.dispose()


def owner() -> str:
    """Who claims the jobs ``--store`` completes, as ``evald status`` and ``history`` show it."""
    return f"evald eval:{socket.gethostname()}:{os.getpid()}"


def store(database: Database, where: Place, evaluated: Evaluated) -> Stored:
    """``evaluated``'s result stored as the job of its run, step and task (stage ``full``), in one
    transaction; a job that has succeeded already is left as it is."""
    run = where.run
    claimant = owner()
    with database.session() as session:
        run_id = queries.ensure_run(session, run.name, run.url or str(run.root))
        checkpoint_id = queries.record_checkpoint(
            session,
            run_id=run_id,
            path=str(where.path),
            name=where.name,
            step=where.step,
            epoch=where.epoch,
            layout=where.layout,
            state=CheckpointState.READY,
        )
        task = evaluated.task
        queries.enqueue_jobs(session, checkpoint_id=checkpoint_id, step=where.step, tasks=[task])
        found = queries.job_at(session, checkpoint_id=checkpoint_id, task=task, stage=stages.FULL)
        assert found is not None  # enqueued just now, or there already
        job_id, state = found
        stored = Stored(task, job_id, state is not JobState.SUCCEEDED, run.name, where.step, where.name)
        if not stored.added:
            return stored
        claimed = queries.claim_job(session, job_id, claimant)
        if claimed is None:
            raise EvaldError(
                f"--store: job {job_id} (run {run.name!r}, step {where.step}, task {task!r}) is running "
                "under a daemon now: not stored (its own result will be)"
            )
        _complete(session, claimed, claimant, evaluated)
    return stored


def _complete(session: Session, job: queries.ClaimedJob, claimant: str, evaluated: Evaluated) -> None:
    """The claimed job's results, samples and problems, ``succeeded``, and its history row: what the
    daemon's :class:`~daemon.running.recording.Recorder` stores for a worker's result."""
    result, spec = evaluated.result, evaluated.spec
    consistency = result.consistency
    duration = (evaluated.finished_at - evaluated.started_at).total_seconds()
    stored = queries.complete_job(
        session,
        job_id=job.id,
        owner=claimant,
        metrics=[queries.MetricRow(m.name, m.value, m.n, m.stderr) for m in result.metrics],
        samples=[queries.SampleRow(**s.model_dump()) for s in result.samples],
        duration_s=duration,
        load_s=result.timing.load_s if result.timing else None,
        tp_disagreements=None if consistency is None else len(consistency.disagreements),
        problems=[queries.ProblemRow(**p.model_dump()) for p in result.problems],
        attempt=job.attempts,
    )
    assert stored  # claimed in this transaction
    queries.record_attempt(
        session,
        queries.AttemptRow(
            job_id=job.id,
            attempt=job.attempts,
            engine=spec.inference.engine,
            tp=spec.inference.tp,
            dp=spec.inference.dp,
            batch_size=spec.task.batch_size,
            outcome="succeeded",
            error_kind=None,
            error=None,
            started_at=evaluated.started_at,
            finished_at=evaluated.finished_at,
            duration_s=duration,
        ),
    )
