"""Runs claimed jobs in worker processes and stores what they return.

The worker is a separate process group: a crash, an OOM or a hang stays there. The daemon reads only its
exit status and result file, and stores the results, the samples and the ``succeeded`` state in one
transaction, so a job is either wholly stored or not at all (and then runs again).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import structlog

from daemon import stages
from daemon.config import Config
from daemon.errors import JobSetupError
from daemon.planner import Planner
from daemon.resources import ResourceProbe
from inference.spec import EXIT_INPUT_ERROR, PARENT_PID_ENV, JobResult, JobSpec
from storage import queries
from storage import scheduling as store
from storage.database import Database
from storage.models import CheckpointState, JobState, utcnow

log = structlog.get_logger("evald.runner")

#: How much of a crashed worker's stderr is kept on the job.
STDERR_TAIL_CHARS = 4000


def build_spec(config: Config, job: queries.ClaimedJob, job_dir: Path) -> JobSpec:
    task = config.task(job.task)
    if task is None:
        raise JobSetupError(f"task {job.task!r} is no longer in the config")
    subset = None
    if job.stage == stages.QUICK:
        two_stage = config.scheduling.two_stage.get(job.task)
        if two_stage is None:
            raise JobSetupError(f"task {job.task!r} has a quick job but no [scheduling.two_stage.{job.task}]")
        subset = two_stage.subset()
    run = config.run(job.run)
    return JobSpec(
        job_id=job.id,
        checkpoint_path=Path(job.checkpoint_path),
        layout=job.layout,
        hf_config=run.hf_config if run is not None else None,
        task=task.spec(subset),
        inference=config.inference.spec(),
        result_path=job_dir / "result.json",
        seed=config.inference.seed,
        max_samples=config.inference.max_samples,
    )


def stderr_tail(path: Path, limit: int = STDERR_TAIL_CHARS) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        return ""


@dataclass
class RunningJob:
    job: queries.ClaimedJob
    spec: JobSpec
    process: subprocess.Popen[bytes]
    stderr_path: Path
    started: float = field(default_factory=time.monotonic)
    last_heartbeat: float = field(default_factory=time.monotonic)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


class JobRunner:
    def __init__(
        self,
        config: Config,
        database: Database,
        owner: str,
        *,
        planner: Planner | None = None,
        probe: ResourceProbe | None = None,
    ) -> None:
        self._config = config
        self._db = database
        self._owner = owner
        #: Plans the follow-ups of a stored result (full stage, adaptive interval) in its transaction.
        self._planner = planner
        #: The resource thresholds; None when none is set.
        self._probe = probe
        self._python = str(config.inference.python or sys.executable)
        self.running: dict[int, RunningJob] = {}
        self._deferred_reason: str | None = None

    def has_capacity(self) -> bool:
        return len(self.running) < self._config.scheduling.max_concurrent

    def resources_met(self) -> bool:
        """Check the thresholds; when unmet, defer every waiting job with the reason and return False."""
        if self._probe is None:
            return True
        check = self._probe.check()
        if check.met:
            if self._deferred_reason is not None:
                log.info("resources.met", previously=self._deferred_reason)
                self._deferred_reason = None
            return True
        if self.running:
            # Our own evaluations hold the resources: the rest wait for a slot, queued rather than deferred
            # (and never reported stuck because of us).
            return False
        with self._db.session() as session:
            newly = store.defer_pending(session, check.reason, utcnow())
        if newly or check.reason != self._deferred_reason:
            log.warning("job.deferred", jobs=newly, reason=check.reason)
        self._deferred_reason = check.reason
        return False

    def recheck_deferred(self) -> int:
        """The deferral re-check: release deferred jobs once the resources are there; returns how many."""
        with self._db.session() as session:
            if store.count_jobs(session, JobState.DEFERRED) == 0:
                return 0
        if not self.resources_met():
            return 0
        with self._db.session() as session:
            released = store.release_deferred(session)
        if released:
            log.info("job.released", jobs=released)
        return released

    def report_stuck(self) -> int:
        """Housekeeping: a ``stuck`` event for each job deferred past ``stuck_after_secs``."""
        now = utcnow()
        limit = timedelta(seconds=self._config.scheduling.stuck_after_secs)
        with self._db.session() as session:
            stuck = store.mark_stuck(session, deferred_before=now - limit, now=now)
        for job in stuck:
            log.error(
                "job.stuck",
                job_id=job.id,
                run=job.run,
                step=job.step,
                task=job.task,
                stage=job.stage,
                deferred_secs=round((now - job.deferred_at).total_seconds()),
                reason=job.reason,
            )
        return len(stuck)

    def claim_and_start(self) -> bool:
        """Claim the most urgent pending job and start its worker; False when the queue is empty or the
        resources are not there (the waiting jobs are then deferred)."""
        with self._db.session() as session:
            if store.count_jobs(session, JobState.PENDING, JobState.DEFERRED) == 0:
                return False
        if not self.resources_met():
            return False
        oldest_first = self._planner.oldest_first if self._planner is not None else frozenset()
        with self._db.session() as session:
            job = queries.claim_next_job(session, self._owner, oldest_first=oldest_first)
        if job is None:
            return False
        job_dir = self._config.daemon.state_dir / "jobs" / f"{job.id}-{job.attempts}"
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            spec = build_spec(self._config, job, job_dir)
            spec_path = job_dir / "spec.json"
            spec_path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
            stderr_path = job_dir / "worker.log"
            with stderr_path.open("wb") as stderr:
                process = subprocess.Popen(
                    [self._python, "-m", "inference.worker", str(spec_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=stderr,
                    stderr=stderr,
                    start_new_session=True,
                    # The worker arms PR_SET_PDEATHSIG against this pid (a preexec_fn is unsafe with threads).
                    env={**os.environ, PARENT_PID_ENV: str(os.getpid())},
                )
        except (OSError, JobSetupError) as exc:
            self._fail(job, "setup", f"could not start worker: {exc}", None)
            return True
        self.running[job.id] = RunningJob(job, spec, process, stderr_path)
        log.info(
            "job.started", job_id=job.id, run=job.run, step=job.step, task=job.task, attempt=job.attempts
        )
        return True

    def poll(self) -> int:
        """Collect finished workers, kill timed-out ones, and keep the leases of the rest fresh.

        Returns how many jobs ended, each of which frees a slot.
        """
        now = time.monotonic()
        ended = len(self.running)
        for job_id, running in list(self.running.items()):
            code = running.process.poll()
            if code is None:
                if now - running.started > self._config.inference.job_timeout_secs:
                    running.kill()
                    del self.running[job_id]
                    timeout = self._config.inference.job_timeout_secs
                    self._fail(
                        running.job, "timeout", f"worker killed after {timeout:g} s", now - running.started
                    )
                elif now - running.last_heartbeat >= self._config.scheduling.heartbeat_secs:
                    with self._db.session() as session:
                        queries.heartbeat(session, job_id, self._owner)
                    running.last_heartbeat = now
                continue
            del self.running[job_id]
            self._finish(running, code, now - running.started)
        return ended - len(self.running)

    def _finish(self, running: RunningJob, code: int, duration: float) -> None:
        job = running.job
        result: JobResult | None = None
        if code in (0, EXIT_INPUT_ERROR):
            try:
                result = JobResult.read(running.spec.result_path)
            except (OSError, ValueError) as exc:
                log.warning("job.result_unreadable", job_id=job.id, error=str(exc))
        if code == 0 and result is not None and result.error is None:
            self._store(job, result, duration)
        elif result is not None and result.error is not None:
            self._fail(job, result.error.kind, result.error.message, duration)
        else:
            tail = stderr_tail(running.stderr_path)
            self._fail(job, "crash", f"worker exited with status {code}: {tail}", duration)

    def _store(self, job: queries.ClaimedJob, result: JobResult, duration: float) -> None:
        metrics = [queries.MetricRow(m.name, m.value, m.n, m.stderr) for m in result.metrics]
        samples = [queries.SampleRow(**s.model_dump()) for s in result.samples]
        load_s = result.timing.load_s if result.timing else None
        with self._db.session() as session:
            stored = queries.complete_job(
                session,
                job_id=job.id,
                owner=self._owner,
                metrics=metrics,
                samples=samples,
                duration_s=duration,
                load_s=load_s,
            )
            if stored and self._planner is not None:
                self._planner.after_result(session, job, metrics)
        if stored and not Path(job.checkpoint_path).is_dir():
            # Rotated away after the worker had it in memory: the results stand, the folder is gone.
            with self._db.session() as session:
                reason = "deleted after it was evaluated"
                queries.mark_checkpoint(session, job.checkpoint_id, CheckpointState.VANISHED, reason)
            log.info("checkpoint.vanished", run=job.run, step=job.step, reason=reason)
        if stored:
            values = {m.name: round(m.value, 4) for m in result.metrics}
            log.info(
                "job.succeeded", job_id=job.id, run=job.run, step=job.step, task=job.task, metrics=values
            )
        else:
            log.warning("job.lost_lease", job_id=job.id, run=job.run, step=job.step)

    def _fail(self, job: queries.ClaimedJob, kind: str, message: str, duration: float | None) -> None:
        with self._db.session() as session:
            queries.fail_job(
                session, job_id=job.id, owner=self._owner, kind=kind, error=message, duration_s=duration
            )
            if kind == "checkpoint_vanished":
                queries.mark_checkpoint(session, job.checkpoint_id, CheckpointState.VANISHED, message)
        log.warning(
            "job.failed", job_id=job.id, run=job.run, step=job.step, task=job.task, kind=kind, error=message
        )

    def shutdown(self, grace_secs: float) -> None:
        """Let running jobs finish within ``grace_secs``, then kill and requeue the rest."""
        deadline = time.monotonic() + grace_secs
        while self.running and time.monotonic() < deadline:
            self.poll()
            time.sleep(0.1)
        for job_id, running in list(self.running.items()):
            running.kill()
            with self._db.session() as session:
                queries.requeue_job(session, job_id=job_id, owner=self._owner)
            log.info("job.requeued", job_id=job_id, run=running.job.run, step=running.job.step)
        self.running.clear()
