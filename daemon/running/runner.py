"""Runs claimed jobs in worker processes and stores what they return.

The worker is a separate process group: a crash, an OOM or a hang stays there. The daemon reads only its
exit status and result files, and stores the results, the samples and the ``succeeded`` state in one
transaction, so a job is either wholly stored or not at all (and then runs again).

A worker that runs out of memory is started again at once with half the batch size, down to 1; one that
crashes (a rank dies) or times out gives its job back to the queue until ``max_attempts`` tries are
spent; a rejected input fails the job at once. Every worker run is kept in the job's history.

An error of one job is that job's, never the runner's: storing a result the database refuses (a
constraint, a trigger), a spec that cannot be built, a worker that cannot be started fail that job (kind
``store_failed``, ``setup``) in a fresh transaction, with its alert, and the others go on. Only the
database being away holds a job in memory, to be stored when it answers. Each claim's attempt number is
its fencing token: a result, a failure or a heartbeat is written only under the claim that holds the job,
so a daemon whose lease ran out can never double a result (its attempt is recorded as ``fenced``).

With ``[executor] kind = "slurm"`` a claimed job is submitted (``sbatch``) instead of started here, and
polled every ``poll_secs`` (see :mod:`daemon.running.remote` for what each end becomes). Its Slurm job id
is stored on the job (``executor_handle``) as soon as ``sbatch`` answers and on the attempt's history row
at its end; a daemon that restarts, or takes over a dead daemon's claim, re-attaches to the queued or
running submission (:meth:`JobRunner.reattach`), finding one whose id was never stored by its name and
comment, so that nothing is submitted twice. A stopping daemon leaves its jobs to the scheduler. A
controller that does not answer pauses claiming with one ``executor.unreachable`` line; polling goes on
and ``executor.reachable`` says when it is back.
"""

from __future__ import annotations

import contextlib
import errno
import json
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon import report
from daemon.alerts.lifecycle import Alerter
from daemon.config import Config
from daemon.errors import JobSetupError
from daemon.running import remote
from daemon.running.environment import worker_environment
from daemon.running.executors.base import (
    Active,
    ExecutorError,
    ExecutorUnavailable,
    Handle,
    JobRef,
    Phase,
    Placement,
)
from daemon.running.executors.slurm import SlurmExecutor
from daemon.running.workers import Outcome, WorkerProcess, read_outcome
from daemon.scheduling import stages
from daemon.scheduling.planner import Planner
from daemon.scheduling.resources import ResourceProbe
from inference.launcher import worker_command
from inference.spec import Consistency, JobResult, JobSpec
from storage import queries
from storage import scheduling as store
from storage.database import Database, reason
from storage.errors import DatabaseUnreachable
from storage.models import CheckpointState, JobState, utcnow
from storage.queries import jobs as jobs_store

log = structlog.get_logger("evald.runner")

#: A state folder out of space or quota: the job waits for room instead of failing.
SCRATCH_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
SCRATCH_PAUSE_MAX_SECS = 60.0

#: Failures another try may cure: a rank that died, a hung worker, and the scheduler's ends a retry may
#: cure (a preemption, a failed node, a job it forgot). A rejected input fails at once.
RETRYABLE = frozenset({"crash", "timeout"}) | remote.SCHEDULER_RETRYABLE

#: How often an executor found unusable (no such partition, a job folder not writable) is checked again.
EXECUTOR_RECHECK_SECS = 60.0

#: How much of a poisoned job's error (the database's own words) is kept on the job.
POISON_ERROR_CHARS = 2000

#: How many of a stored result's problems its ``job.problems`` warning quotes (``evald samples`` lists all),
#: and how much of each.
PROBLEMS_LOGGED = 5
PROBLEM_CHARS = 200


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
        run_root=run.root if run is not None else None,
        base_model=run.base_model if run is not None else None,
        task=task.spec(stage_subset=subset),
        inference=config.inference.spec(),
        result_path=job_dir / "result.json",
        seed=config.inference.seed,
        max_samples=config.inference.max_samples,
        max_text_chars=config.inference.max_text_chars,
    )


def halved(spec: JobSpec, job_dir: Path) -> JobSpec:
    """``spec`` again with half its batch size, writing into ``job_dir``."""
    task = spec.task.model_copy(update={"batch_size": max(1, spec.task.batch_size // 2)})
    return spec.model_copy(update={"task": task, "result_path": job_dir / "result.json"})


@dataclass
class RunningJob:
    job: queries.ClaimedJob
    spec: JobSpec
    #: None for a job adopted from a dead daemon whose worker had already finished.
    worker: WorkerProcess | None
    #: The config the job was claimed under: a reload mid-job changes nothing for it.
    config: Config
    #: When the job's first worker of this claim started: the timeout covers its out-of-memory reruns too.
    started: float = field(default_factory=time.monotonic)
    #: When this worker started (its history row).
    started_at: datetime = field(default_factory=utcnow)
    last_heartbeat: float = field(default_factory=time.monotonic)
    #: When the worker was seen to end: what the job's duration and history count, however late the
    #: database lets them be stored.
    ended: float | None = None
    ended_at: datetime | None = None
    #: Its history row is stored: a retry after an outage must not write it twice.
    recorded: bool = False
    #: The executor it was handed to (Slurm); None for a worker process of the daemon's own.
    executor: SlurmExecutor | None = None
    #: The executor's handle; None while whether ``sbatch`` queued it is unknown (slurmctld did not
    #: answer): :meth:`SlurmExecutor.find` is asked before submitting again.
    handle: Handle | None = None
    #: The handle is stored on the job (``executor_handle``).
    handle_recorded: bool = False
    #: When the executor is asked about it next (monotonic).
    next_poll: float = 0.0
    #: Where the scheduler has it (``PENDING (Resources)``), and what of it is stored on the job.
    state: str | None = None
    state_recorded: str | None = None
    placement: Placement = field(default_factory=Placement)
    #: The scheduler's state it ended in (``COMPLETED``, ``TIMEOUT``, ...), for its history row.
    exit_state: str | None = None

    @property
    def remote(self) -> bool:
        return self.executor is not None

    def finish(self) -> None:
        self.ended = time.monotonic()
        self.ended_at = utcnow()

    def kill(self) -> None:
        # A scheduler's job is cancelled on purpose only (JobRunner._cancel_remote), never as a side
        # effect: it outlives its daemon, and the next one re-attaches to it.
        if self.worker is not None:
            self.worker.kill()


class JobRunner:
    def __init__(
        self,
        config: Config,
        database: Database,
        owner: str,
        *,
        planner: Planner | None = None,
        probe: ResourceProbe | None = None,
        alerter: Alerter | None = None,
    ) -> None:
        self._config = config
        self._db = database
        self._owner = owner
        #: Plans the follow-ups of a stored result (full stage, adaptive interval) in its transaction.
        self._planner = planner
        #: Detects anomalies in a stored result's series and queues their alerts, in its transaction.
        self._alerter = alerter
        #: The resource thresholds; None when none is set.
        self._probe = probe
        self._python = str(config.inference.python or sys.executable)
        self.running: dict[int, RunningJob] = {}
        #: Workers that ended but whose outcome is not stored yet (the database was away): stored, in
        #: order, as soon as it answers. Their results are on disk and nothing else may store them.
        self._finished: list[tuple[RunningJob, Outcome]] = []
        self._deferred_reason: str | None = None
        self._stopping = False
        #: The state folder was full (ENOSPC): no claim before this moment; how many times in a row.
        self._paused_until = 0.0
        self._scratch_failures = 0
        #: The Slurm executor (``[executor] kind = "slurm"``); None: worker processes here.
        self._executor: SlurmExecutor | None = None
        #: Why the executor cannot take jobs (no such partition, ...), and when that is checked again.
        self._unusable: str | None = None
        self._recheck_at = 0.0
        #: Since when (monotonic) the executor's controller does not answer; None while it does.
        self._unreachable_since: float | None = None
        #: When a controller away is asked next while no job is due to be polled (monotonic).
        self._next_probe = 0.0
        #: The job checking that the compute nodes see ``job_dir`` (``probe_job_dir``), until it answers.
        self._folder_probe: Handle | None = None
        self._set_executor(config)

    def reconfigure(
        self,
        config: Config,
        *,
        planner: Planner | None,
        probe: ResourceProbe | None,
        alerter: Alerter | None,
    ) -> None:
        """Take a reloaded config for the jobs claimed from now on; running ones keep theirs."""
        self._config = config
        self._planner = planner
        self._probe = probe
        self._alerter = alerter
        self._python = str(config.inference.python or sys.executable)
        self._deferred_reason = None
        if config.executor != self._executor_settings:
            self._set_executor(config)

    def _set_executor(self, config: Config) -> None:
        """Make the executor ``[executor]`` asks for and check it (jobs already handed to the old one stay
        with it)."""
        self._executor_settings = config.executor
        try:
            self._executor = remote.make_executor(config)
        except ExecutorError as exc:
            self._executor = None
            self._unusable = str(exc)
            log.error("executor.unusable", error=self._unusable, action="no job is claimed until it is fixed")
            return
        self._folder_probe = None
        if self._executor is None:
            self._unusable = None
            return
        if self._check_executor() and config.executor.probe_job_dir:
            self._probe_job_dir()

    def _probe_job_dir(self) -> None:
        assert self._executor is not None
        try:
            self._folder_probe = self._executor.probe_job_dir()
        except (ExecutorError, ExecutorUnavailable, OSError) as exc:
            # Not a verdict on the folder: the jobs themselves will tell.
            log.warning("executor.job_dir_unchecked", job_dir=str(self._executor.job_dir), error=str(exc))

    def _read_folder_probe(self) -> None:
        """The folder probe's answer, once its job ended: shared (one line), or not (unusable)."""
        assert self._executor is not None and self._folder_probe is not None
        try:
            seen = self._executor.probe_result(self._folder_probe)
        except ExecutorUnavailable:
            return
        except ExecutorError as exc:
            self._folder_probe = None
            self._unusable = str(exc)
            self._recheck_at = float("inf")  # only a reload with another job_dir clears it
            log.error("executor.unusable", error=str(exc), action="no job is submitted until it is fixed")
            return
        if seen:
            log.info("executor.job_dir_shared", job_dir=str(self._executor.job_dir))
            self._folder_probe = None

    def _check_executor(self) -> bool:
        """Whether the executor can take jobs (partition there, job folder writable); an unusable one is
        logged once with what is wrong and checked again every :data:`EXECUTOR_RECHECK_SECS`."""
        assert self._executor is not None
        self._recheck_at = time.monotonic() + EXECUTOR_RECHECK_SECS
        try:
            self._executor.check()
        except ExecutorUnavailable as exc:
            self._away(str(exc))
            return False
        except ExecutorError as exc:
            self._back()
            if str(exc) != self._unusable:
                log.error(
                    "executor.unusable",
                    error=str(exc),
                    action="jobs stay queued until it is fixed (edit the config and reload)",
                )
            self._unusable = str(exc)
            return False
        self._back()
        if self._unusable is not None:
            log.info("executor.usable", previously=self._unusable)
        self._unusable = None
        return True

    def _away(self, error: str) -> None:
        """The executor's controller did not answer: one line, claiming pauses, polling goes on."""
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            log.warning(
                "executor.unreachable",
                error=error,
                action="claiming paused; queued and running jobs are polled until it answers",
            )

    def _back(self) -> None:
        if self._unreachable_since is not None:
            down = time.monotonic() - self._unreachable_since
            self._unreachable_since = None
            log.info("executor.reachable", down_secs=round(down, 1), jobs=len(self.running))

    @property
    def executor_unusable(self) -> str | None:
        """Why the executor takes no job now (None: it does, or jobs run here)."""
        if self._unusable is not None:
            return self._unusable
        if self._unreachable_since is not None:
            return "the Slurm controller does not answer"
        return None

    def adopt(self, job: queries.ClaimedJob, spec: JobSpec, outcome: Outcome) -> None:
        """Take over a job whose daemon died after its worker had written the result: the next
        :meth:`poll` stores it (results, history, alerts) as if this daemon's worker had run it, instead
        of evaluating the checkpoint again."""
        timing = outcome.result.timing if outcome.result is not None else None
        took = timing.total_s if timing is not None else 0.0
        running = RunningJob(
            job,
            spec,
            None,
            self._config,
            started=time.monotonic() - took,
            started_at=utcnow() - timedelta(seconds=took),
        )
        running.finish()
        self._finished.append((running, outcome))
        log.info("job.adopted", job_id=job.id, run=job.run, step=job.step, result=str(spec.result_path))

    @property
    def _run_ids(self) -> frozenset[int] | None:
        # The planner knows the configured runs' ids; without one (tests, `evald eval`) any run's jobs.
        if self._planner is None:
            return None
        return frozenset(p.run_id for p in self._planner.policies.values())

    @property
    def own_jobs(self) -> frozenset[int]:
        """Jobs this runner holds: running, or ended and waiting to be stored."""
        return frozenset(self.running) | frozenset(r.job.id for r, _ in self._finished)

    @property
    def unrecorded(self) -> int:
        """Jobs whose worker ended while the database was away, waiting to be stored."""
        return len(self._finished)

    @property
    def paused(self) -> bool:
        """Claiming waits for room in the state folder (see :meth:`_scratch_full`), or for the executor
        (its controller away, or unusable as configured)."""
        return self._paused_until > time.monotonic() or self.executor_unusable is not None

    def has_capacity(self) -> bool:
        if self.paused:
            return False
        if self._executor is not None:
            return len(self.running) < self._config.executor.max_queued
        return len(self.running) < self._config.scheduling.max_concurrent

    def resources_met(self) -> bool:
        """Check the thresholds; when unmet, defer every waiting job with the reason and return False.
        Jobs through Slurm use the cluster's resources, not this node's: no threshold applies."""
        if self._probe is None or self._executor is not None:
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
            for item in stuck:
                if self._alerter is None:
                    break
                self._alerter.operational(
                    session,
                    item,
                    rule="deferred_stuck",
                    severity="warning",
                    message=f"job {item.id} ({item.task}/{item.stage} at step {item.step}) deferred for "
                    f"{(now - item.deferred_at).total_seconds():.0f} s: {item.reason}",
                )
        if stuck and self._alerter is not None:
            self._alerter.after_commit()
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
        executor = self._executor
        with self._db.session() as session:
            full = self._full_runs(session) if executor is not None else frozenset()
            if full is None:
                return False
            job = queries.claim_next_job(
                session,
                self._owner,
                oldest_first=oldest_first,
                runs=self._run_ids,
                tasks=frozenset(t.name for t in self._config.tasks),
                exclude_runs=full,
                newest_first=executor is not None and self._config.executor.priority == "newest",
            )
        if job is None:
            return False
        if executor is not None:
            job_dir = executor.job_folder(JobRef(job.id, job.attempts))
        else:
            job_dir = self._config.daemon.state_dir / "jobs" / f"{job.id}-{job.attempts}"
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            spec = build_spec(self._config, job, job_dir)
        except OSError as exc:
            if exc.errno in SCRATCH_FULL:
                self._scratch_full(job, exc)
                return False
            self._fail(job, "setup", f"could not start worker: {exc}", None)
            return True
        except JobSetupError as exc:
            self._fail(job, "setup", f"could not start worker: {exc}", None)
            return True
        except Exception as exc:
            # A spec the config cannot build for this job (a bug, a value no check foresaw): this job's.
            self._setup_failed(job, exc)
            return True
        self._launch(job, spec)
        return True

    def _full_runs(self, session: Session) -> frozenset[int] | None:
        """Runs at ``max_queued_per_run`` jobs queued or running in Slurm; None when all are at
        ``max_queued`` (counted in the database, so daemons sharing it share the limit, and among this
        daemon's own jobs, whose submission may not be stored yet)."""
        limits = self._config.executor
        stored = jobs_store.submitted_per_run(session)
        own: dict[int, int] = {}
        for running in self.running.values():
            own[running.job.run_id] = own.get(running.job.run_id, 0) + 1
        per_run = {run: max(stored.get(run, 0), own.get(run, 0)) for run in {*stored, *own}}
        if max(sum(stored.values()), len(self.running)) >= limits.max_queued:
            return None
        if limits.max_queued_per_run is None:
            return frozenset()
        return frozenset(run for run, n in per_run.items() if n >= limits.max_queued_per_run)

    def _setup_failed(self, job: queries.ClaimedJob, exc: Exception) -> None:
        message = f"could not start worker: {type(exc).__name__}: {reason(exc)}"
        try:
            self._fail(job, "setup", message, None)
        except DatabaseUnreachable:
            raise
        except Exception as again:
            log.error(
                "job.unrecordable",
                job_id=job.id,
                run=job.run,
                step=job.step,
                error=message,
                also=f"{type(again).__name__}: {reason(again)}",
                action="left running: its lease (or the next start) gives it back, within max_attempts",
            )

    def _scratch_full(self, job: queries.ClaimedJob, exc: OSError) -> None:
        """The state folder cannot take a job's files: the job goes back to the queue without spending an
        attempt, and claiming pauses (longer each time, up to a minute) until there is room again."""
        with self._db.session() as session:
            queries.requeue_job(session, job_id=job.id, owner=self._owner, attempt=job.attempts)
        self._scratch_failures += 1
        pause = min(SCRATCH_PAUSE_MAX_SECS, 2.0 ** (self._scratch_failures - 1))
        self._paused_until = time.monotonic() + pause
        if self._scratch_failures == 1:
            log.error(
                "scratch.full",
                state_dir=str(self._config.daemon.state_dir),
                job_id=job.id,
                error=str(exc),
                action="jobs wait in the queue until there is room",
            )

    def _launch(
        self,
        job: queries.ClaimedJob,
        spec: JobSpec,
        since: float | None = None,
        running_config: Config | None = None,
    ) -> None:
        job_dir = spec.result_path.parent
        config = self._config if running_config is None else running_config
        if self._executor is not None:
            self._submit(job, spec, since, config, self._executor)
            return
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            # A job given back at shutdown reuses its folder: nothing an earlier worker left may be read
            # as this one's.
            for stale in (*job_dir.glob("result*.json"), *job_dir.glob("rank-*.log")):
                stale.unlink(missing_ok=True)
            spec_path = job_dir / "spec.json"
            spec_path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
            command = worker_command(
                spec.inference,
                spec_path,
                python=self._python,
                hostfile=config.inference.hostfile,
                launcher_args=config.inference.launcher_args,
            )
            worker = WorkerProcess.start(command, job_dir / "worker.log", worker_environment(config))
        except OSError as exc:
            if exc.errno in SCRATCH_FULL:
                self._scratch_full(job, exc)
                return
            self._fail(job, "setup", f"could not start worker: {exc}", None)
            return
        except Exception as exc:
            self._setup_failed(job, exc)
            return
        self.running[job.id] = RunningJob(job, spec, worker, config, started=since or time.monotonic())
        if self._scratch_failures:
            log.info("scratch.writable", state_dir=str(config.daemon.state_dir), after=self._scratch_failures)
            self._scratch_failures = 0
        log.info(
            "job.started",
            job_id=job.id,
            run=job.run,
            step=job.step,
            task=job.task,
            attempt=job.attempts,
            engine=spec.inference.engine,
            tp=spec.inference.tp,
            dp=spec.inference.dp,
            batch_size=spec.task.batch_size,
        )

    # --- jobs handed to an executor (Slurm) ------------------------------------------------------------

    def _submit(
        self,
        job: queries.ClaimedJob,
        spec: JobSpec,
        since: float | None,
        config: Config,
        executor: SlurmExecutor,
    ) -> None:
        """Write the job's folder under ``executor.job_dir`` and submit it; its handle is stored on the
        job before the runner moves on (or, with the database away, at the next :meth:`poll`)."""
        job_dir = spec.result_path.parent
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            for stale in (*job_dir.glob("result*.json"), *job_dir.glob("rank-*.log")):
                stale.unlink(missing_ok=True)
            (job_dir / "spec.json").write_text(spec.model_dump_json(indent=1), encoding="utf-8")
        except OSError as exc:
            self._fail(job, "setup", f"could not write the job folder {job_dir}: {exc}", None)
            return
        running = RunningJob(job, spec, None, config, started=since or time.monotonic(), executor=executor)
        self.running[job.id] = running
        self._hand_over(running)
        if running.handle is not None and job.id in self.running:
            self._record_handle(running)

    def _ref(self, running: RunningJob) -> JobRef:
        job = running.job
        return JobRef(job.id, job.attempts, job.run, job.task)

    def _hand_over(self, running: RunningJob) -> None:
        """``sbatch`` the job's folder. Refused: the job fails with sbatch's words, or, when the executor
        itself is at fault (the partition is gone), goes back to the queue and claiming pauses.
        Unanswered: the handle stays unknown and the next poll finds the submission or submits again."""
        assert running.executor is not None
        job, spec = running.job, running.spec
        try:
            handle = running.executor.start(spec.result_path.parent / "spec.json", self._ref(running))
        except ExecutorUnavailable as exc:
            self._away(str(exc))
            running.handle = None
            running.next_poll = time.monotonic() + self._config.executor.poll_secs
            return
        except (ExecutorError, OSError) as exc:
            del self.running[job.id]
            running.finish()
            self._rejected(running, str(exc))
            return
        self._back()
        running.handle = handle
        running.handle_recorded = False
        running.next_poll = time.monotonic() + self._config.executor.poll_secs
        log.info(
            "job.submitted",
            job_id=job.id,
            run=job.run,
            step=job.step,
            task=job.task,
            attempt=job.attempts,
            slurm_job_id=handle.external_id,
            job_dir=str(handle.job_dir),
        )

    def _rejected(self, running: RunningJob, error: str) -> None:
        """``sbatch`` refused the job. When the executor is at fault as configured (its check fails too)
        the job goes back to the queue without spending an attempt and claiming pauses until it is fixed;
        otherwise the job is to blame and fails with what Slurm said."""
        job = running.job
        if self._executor is not None and not self._check_executor():
            self._record(running, "requeued", Outcome(error_kind="executor_unusable", error=error))
            with self._db.session() as session:
                queries.requeue_job(session, job_id=job.id, owner=self._owner, attempt=job.attempts)
            return
        self._record(running, "failed", Outcome(error_kind="rejected", error=error))
        self._fail(job, "rejected", error, None)

    def _record_handle(self, running: RunningJob) -> None:
        job = running.job
        handle = None if running.handle is None else running.handle.to_json()
        with self._db.session() as session:
            held = jobs_store.record_handle(
                session, job_id=job.id, owner=self._owner, attempt=job.attempts, handle=handle
            )
        running.handle_recorded = True
        if not held:
            log.warning("job.handle_unrecorded", job_id=job.id, reason="the claim is no longer this daemon's")

    def _poll_remote(self, now: float) -> None:
        """Ask the executor about each job handed to it that is due (``poll_secs``); its end goes to
        ``_finished`` like a local worker's. No database here. The first unanswered question ends the
        round: the others would wait for the same controller. While it is away each question waits for
        it (about 8 s: the tools' own retries), so every job's next one is counted from the end of the
        unanswered one: the loop is free for at least ``poll_secs`` between them."""
        if self._unusable is not None and self._executor is not None and now >= self._recheck_at:
            self._check_executor()
        if self._folder_probe is not None and self._unreachable_since is None and now >= self._next_probe:
            self._next_probe = now + self._config.executor.poll_secs
            self._read_folder_probe()
        due = [r for r in self.running.values() if r.remote and now >= r.next_poll]
        if not due and self._unreachable_since is not None and self._executor is not None:
            # No job to ask about: the controller is asked whether it is back every poll_secs all the same.
            if now >= self._next_probe:
                self._check_executor()
                self._next_probe = time.monotonic() + self._config.executor.poll_secs
            return
        for running in due:
            running.next_poll = now + running.config.executor.poll_secs
            try:
                self._poll_one(running)
            except ExecutorUnavailable as exc:
                self._away(str(exc))
                after = time.monotonic()
                for waiting in self.running.values():
                    if waiting.remote:
                        waiting.next_poll = max(waiting.next_poll, after + waiting.config.executor.poll_secs)
                self._next_probe = after + self._config.executor.poll_secs
                return
            self._back()

    def _poll_one(self, running: RunningJob) -> None:
        executor, job = running.executor, running.job
        assert executor is not None
        if running.handle is None:
            found = executor.find(self._ref(running))
            if found is None:
                log.info(
                    "job.resubmitting", job_id=job.id, attempt=job.attempts, reason="sbatch did not answer"
                )
                self._hand_over(running)
                return
            running.handle, running.handle_recorded = found, False
            log.info("job.reattached", job_id=job.id, attempt=job.attempts, slurm_job_id=found.external_id)
            return
        status = executor.poll(running.handle)
        running.placement = status.placement
        if isinstance(status, Active):
            state = remote.state_line(status)
            if state != running.state:
                log.info(
                    "job.scheduler_state",
                    job_id=job.id,
                    slurm_job_id=running.handle.external_id,
                    state=state,
                    reason=status.reason,
                )
            running.state = state
            if status.phase in (Phase.PENDING, Phase.REQUEUED):
                gone = self._gone(running)
                if gone is not None:
                    executor.cancel(running.handle)
                    running.exit_state = "CANCELLED"
                    self._ended(running, Outcome(error_kind=gone[0], error=gone[1]))
            return
        running.exit_state = status.placement.state or status.kind.value.upper()
        try:
            outcome = remote.outcome_of(status, running.spec)
        except Exception as exc:
            outcome = Outcome(error_kind="result_unreadable", error=f"reading the job's files: {exc!r}")
        self._ended(running, outcome)

    def _ended(self, running: RunningJob, outcome: Outcome) -> None:
        del self.running[running.job.id]
        running.finish()
        self._finished.append((running, outcome))

    def _gone(self, running: RunningJob) -> tuple[str, str] | None:
        """Why a queued job should not run any more: its checkpoint deleted, or its run removed from the
        config; None while it should."""
        job = running.job
        if self._run_ids is not None and job.run_id not in self._run_ids:
            return "run_removed", f"run {job.run!r} was removed from the config while job {job.id} was queued"
        if not Path(job.checkpoint_path).is_dir():
            return (
                "checkpoint_vanished",
                f"{job.checkpoint_path} was deleted while job {job.id} was queued in Slurm: cancelled",
            )
        return None

    def _remote_bookkeeping(self) -> None:
        """Store what the database does not know yet of the jobs handed to the executor: a handle
        (a submission found again, or one made while the database was away) and the scheduler's state."""
        for running in list(self.running.values()):
            if not running.remote:
                continue
            if running.handle is not None and not running.handle_recorded:
                self._record_handle(running)
            if running.state is not None and running.state != running.state_recorded:
                job = running.job
                with self._db.session() as session:
                    jobs_store.set_executor_state(
                        session, job_id=job.id, owner=self._owner, attempt=job.attempts, state=running.state
                    )
                running.state_recorded = running.state

    def _handed_over(self, running: RunningJob) -> bool:
        """The lease of a job in Slurm ran out: True when the daemon that took the claim re-attached to
        the same submission (it records the attempt now; nothing is cancelled), else the submission is
        cancelled (a new claim submits its own) and False."""
        handle = running.handle
        with self._db.session() as session:
            stored = jobs_store.job_handle(session, running.job.id)
        if handle is not None and stored == (running.job.attempts, handle.to_json()):
            log.warning(
                "job.handed_over",
                job_id=running.job.id,
                attempt=running.job.attempts,
                slurm_job_id=handle.external_id,
                reason="its lease ran out and another daemon re-attached to its Slurm job",
            )
            return True
        self._cancel_remote(running)
        return False

    def _cancel_remote(self, running: RunningJob) -> None:
        if running.executor is None or running.handle is None:
            return
        try:
            running.executor.cancel(running.handle)
        except ExecutorUnavailable as exc:
            log.error(
                "job.not_cancelled",
                job_id=running.job.id,
                slurm_job_id=running.handle.external_id,
                error=str(exc),
            )

    def _leave_to_scheduler(self) -> None:
        """At shutdown: jobs in Slurm go on there; their claims stay, and the next daemon re-attaches."""
        for job_id, running in list(self.running.items()):
            if not running.remote:
                continue
            del self.running[job_id]
            log.info(
                "job.left_to_scheduler",
                job_id=job_id,
                run=running.job.run,
                attempt=running.job.attempts,
                slurm_job_id=running.handle.external_id if running.handle is not None else None,
                recorded=running.handle_recorded,
            )

    def reattach(self, session: Session, orphan: jobs_store.Orphan) -> bool:
        """Take over an orphan (a dead daemon's claim, locked by :func:`queries.orphans`) whose Slurm job
        is still known: by the handle stored on it, else found by name and comment; True when taken (it
        is polled from now on and nothing is submitted again), False to recover it as usual. With the
        controller away and a job folder for the claim, the claim is taken and its submission looked
        for once the controller answers."""
        executor = self._executor
        if executor is None:
            return False
        ref = JobRef(orphan.id, orphan.attempts)
        handle = _stored_handle(orphan, executor.kind)
        recorded = handle is not None
        how = "recorded"
        if handle is None:
            try:
                handle = executor.find(ref)
                how = "found by name"
            except ExecutorUnavailable as exc:
                self._away(str(exc))
                how = "to be found"
        folder = handle.job_dir if handle is not None else executor.job_folder(ref)
        try:
            spec = JobSpec.model_validate_json((folder / "spec.json").read_bytes())
        except (OSError, ValueError):
            if handle is not None:
                # Without its spec nobody can store what it returns: it would only hold the cluster.
                with contextlib.suppress(ExecutorUnavailable):
                    executor.cancel(handle)
            return False
        if handle is None and how != "to be found":
            return False
        job = queries.take_over(session, orphan.id, self._owner)
        if handle is not None and not recorded:
            jobs_store.record_handle(
                session, job_id=job.id, owner=self._owner, attempt=job.attempts, handle=handle.to_json()
            )
        running = RunningJob(
            job,
            spec,
            None,
            self._config,
            started_at=orphan.started_at or utcnow(),
            executor=executor,
            handle=handle,
            handle_recorded=handle is not None,
        )
        self.running[job.id] = running
        log.info(
            "job.reattached",
            job_id=job.id,
            run=job.run,
            attempt=job.attempts,
            slurm_job_id=handle.external_id if handle is not None else None,
            how=how,
            was=orphan.claimed_by,
        )
        return True

    def poll(self) -> int:
        """Collect finished workers, kill timed-out ones, store what they returned, and keep the leases of
        the rest fresh.

        Returns how many jobs ended, each of which frees a slot. Workers are collected before anything
        touches the database, so while it is away (:class:`DatabaseUnreachable`, raised once the outcome
        is kept for the next call) timeouts still hold and nothing a worker wrote is lost.
        """
        before = len(self.running) + len(self._finished)
        now = time.monotonic()
        self._poll_remote(now)
        for job_id, running in list(self.running.items()):
            if running.worker is None:
                continue
            code = running.worker.poll()
            if code is None:
                timeout = running.config.inference.job_timeout_secs
                if now - running.started > timeout:
                    running.kill()
                    del self.running[job_id]
                    outcome = Outcome(error_kind="timeout", error=f"worker killed after {timeout:g} s")
                    running.finish()
                    self._finished.append((running, outcome))
                continue
            del self.running[job_id]
            running.finish()
            self._finished.append((running, self._outcome(running, code)))
        while self._finished:
            running, outcome = self._finished[0]
            try:
                self._end(running, outcome)
            except DatabaseUnreachable:
                raise  # kept, in order, for the next call
            except Exception as exc:
                # This job's, not the loop's: it fails, and the ones behind it are stored.
                self._poisoned(running, exc)
            self._finished.pop(0)
        self._remote_bookkeeping()
        self._heartbeats(now)
        return before - len(self.running) - len(self._finished)

    @staticmethod
    def _outcome(running: RunningJob, code: int) -> Outcome:
        assert running.worker is not None
        try:
            return read_outcome(running.spec, code, running.worker.log_path)
        except Exception as exc:
            # Files no reader expected (a result that is not a file, say): the job's problem.
            return Outcome(error_kind="result_unreadable", error=f"reading the worker's files: {exc!r}")

    def _poisoned(self, running: RunningJob, exc: Exception, *, doing: str = "storing its result") -> None:
        """The job whose outcome could not be stored (the database refused it, or a bug on the way) fails
        with the database's own words, in a fresh transaction, with its ``eval_failed`` alert: one
        ``job.failed`` line, and the loop goes on. Raises only :class:`DatabaseUnreachable` (the job is
        then tried again, from the start, when the database answers)."""
        job = running.job
        kind = "store_failed"
        message = report.one_line(f"{doing} failed: {type(exc).__name__}: {reason(exc)}", POISON_ERROR_CHARS)
        duration = (running.ended or time.monotonic()) - running.started
        try:
            with self._db.session() as session:
                if not running.recorded:
                    self._record_in(session, running, "failed", Outcome(error_kind=kind, error=message))
                ours = self._fail_in(session, job, kind, message, duration, retry=False)
            running.recorded = True
        except DatabaseUnreachable:
            raise
        except Exception as again:
            # The history row or the alert is what the database refuses: the job's state alone, then.
            try:
                with self._db.session() as session:
                    ours = queries.fail_job(
                        session,
                        job_id=job.id,
                        owner=self._owner,
                        kind=kind,
                        error=message,
                        duration_s=duration,
                        attempt=job.attempts,
                    )
            except DatabaseUnreachable:
                raise
            except Exception as last:
                log.error(
                    "job.unrecordable",
                    job_id=job.id,
                    run=job.run,
                    step=job.step,
                    task=job.task,
                    error=message,
                    also=f"{type(last).__name__}: {reason(last)}",
                    result=str(running.spec.result_path),
                    action="left running: its lease (or the next start) gives it back, within max_attempts",
                    exc_info=exc,
                )
                return
            message = f"{message} (and recording it: {type(again).__name__}: {reason(again)})"
        if self._alerter is not None:
            self._alerter.after_commit()
        log.error(
            "job.failed",
            job_id=job.id,
            run=job.run,
            step=job.step,
            task=job.task,
            attempt=job.attempts,
            kind=kind,
            error=message,
            held=ours,
            exc_info=exc,
        )

    def _heartbeats(self, now: float) -> None:
        for job_id, running in list(self.running.items()):
            if now - running.last_heartbeat < running.config.scheduling.heartbeat_secs:
                continue
            # A beat that fails ends the pass and is tried again in the next one: the daemon's loop
            # spaces those out while the database is away.
            try:
                with self._db.session() as session:
                    held = queries.heartbeat(session, job_id, self._owner, running.job.attempts)
            except DatabaseUnreachable:
                raise
            except Exception as exc:
                # The database refuses this job's row: it fails, and the others' leases stay fresh.
                del self.running[job_id]
                running.kill()
                running.finish()
                self._poisoned(running, exc, doing="refreshing its lease")
                continue
            running.last_heartbeat = now
            if not held:
                self._lost(running)

    def _lost(self, running: RunningJob) -> None:
        """The job was taken from this daemon (its lease ran out and another claim holds it): the worker
        is stopped, its attempt is recorded as ``fenced``, and nothing it returns is stored."""
        job = running.job
        del self.running[job.id]
        if running.remote and self._handed_over(running):
            return
        running.kill()
        running.finish()
        note = "its lease ran out and another claim holds the job; the worker was stopped"
        self._record(running, "fenced", Outcome(error_kind="lost_lease", error=note))
        log.warning("job.lost_lease", job_id=job.id, run=job.run, step=job.step, attempt=job.attempts)

    def _end(self, running: RunningJob, outcome: Outcome) -> None:
        """Store, retry or fail the job whose worker ended with ``outcome``; the run goes into its history."""
        job, spec = running.job, running.spec
        duration = (running.ended or time.monotonic()) - running.started
        batch = spec.task.batch_size
        if outcome.result is not None:
            self._store(running, outcome, outcome.result, duration)
            return
        kind = outcome.error_kind or "crash"
        if kind == "run_removed":
            # Its run left the config while it was queued: back to the queue for a daemon that has it.
            self._record(running, "cancelled", outcome)
            with self._db.session() as session:
                queries.requeue_job(session, job_id=job.id, owner=self._owner, attempt=job.attempts)
            log.info("job.cancelled", job_id=job.id, run=job.run, step=job.step, reason=outcome.error)
            return
        if kind == "disk_full":
            self._disk_full(running, outcome)
            return
        if kind == "checkpoint_vanished" and running.remote:
            self._record(running, "cancelled", outcome)
            self._fail(job, kind, outcome.error, duration)
            return
        if kind == "out_of_memory" and batch > 1 and self._stopping:
            # Shutting down: the rerun would only be killed; the next claim starts it again.
            self._record(running, "requeued", outcome)
            with self._db.session() as session:
                queries.requeue_job(session, job_id=job.id, owner=self._owner, attempt=job.attempts)
            return
        if kind == "out_of_memory" and batch > 1:
            self._record(running, "out_of_memory", outcome)
            job_dir = spec.result_path.parent.with_name(f"{job.id}-{job.attempts}-batch{batch // 2}")
            log.warning(
                "job.out_of_memory",
                job_id=job.id,
                run=job.run,
                step=job.step,
                batch_size=batch,
                retry_batch_size=batch // 2,
            )
            self._launch(job, halved(spec, job_dir), since=running.started, running_config=running.config)
            return
        retry = kind in RETRYABLE and job.attempts < running.config.inference.max_attempts
        self._record(running, "retried" if retry else "failed", outcome)
        self._fail(job, kind, outcome.error, duration, retry=retry)

    def _disk_full(self, running: RunningJob, outcome: Outcome) -> None:
        """The worker evaluated but found no room for its result: the host's fault, not the checkpoint's.
        The job goes back to the queue without spending an attempt, and claiming pauses (longer each time
        in a row, as for a full state folder) until there is room."""
        job = running.job
        self._record(running, "requeued", outcome)
        with self._db.session() as session:
            queries.requeue_job(
                session,
                job_id=job.id,
                owner=self._owner,
                attempt=job.attempts,
                error_kind="disk_full",
                error=outcome.error,
            )
        self._scratch_failures += 1
        pause = min(SCRATCH_PAUSE_MAX_SECS, 2.0 ** (self._scratch_failures - 1))
        self._paused_until = time.monotonic() + pause
        log.error(
            "job.disk_full",
            job_id=job.id,
            run=job.run,
            step=job.step,
            task=job.task,
            error=outcome.error.splitlines()[0],
            action=f"requeued without spending an attempt; claiming pauses {pause:g} s",
        )

    def _record(self, running: RunningJob, outcome: str, ended: Outcome) -> None:
        if running.recorded:
            return
        with self._db.session() as session:
            self._record_in(session, running, outcome, ended)
        running.recorded = True

    @staticmethod
    def _record_in(session: Session, running: RunningJob, outcome: str, ended: Outcome) -> None:
        """The worker run's history row, in the caller's transaction."""
        spec = running.spec
        now = running.ended_at or utcnow()
        queries.record_attempt(
            session,
            queries.AttemptRow(
                job_id=running.job.id,
                attempt=running.job.attempts,
                engine=spec.inference.engine,
                tp=spec.inference.tp,
                dp=spec.inference.dp,
                batch_size=spec.task.batch_size,
                outcome=outcome,
                error_kind=ended.error_kind,
                error=ended.error or None,
                started_at=running.started_at,
                finished_at=now,
                duration_s=(now - running.started_at).total_seconds(),
                slurm_job_id=running.handle.external_id if running.handle is not None else None,
                nodes=running.placement.nodes or None,
                queue_wait_s=running.placement.queue_wait_s,
                run_s=running.placement.run_s,
                exit_state=running.exit_state,
            ),
            replaces_lost=outcome == "fenced",
        )

    def _store(self, running: RunningJob, outcome: Outcome, result: JobResult, duration: float) -> None:
        """The results, samples, ``succeeded`` and the worker run's history row, in one transaction; under
        a claim no longer ours (a stale token) nothing is stored and the run is recorded ``fenced``."""
        job = running.job
        metrics = [queries.MetricRow(m.name, m.value, m.n, m.stderr) for m in result.metrics]
        samples = [queries.SampleRow(**s.model_dump()) for s in result.samples]
        problems = [queries.ProblemRow(**p.model_dump()) for p in result.problems]
        load_s = result.timing.load_s if result.timing else None
        consistency = result.consistency
        with self._db.session() as session:
            stored = queries.complete_job(
                session,
                job_id=job.id,
                owner=self._owner,
                metrics=metrics,
                samples=samples,
                duration_s=duration,
                load_s=load_s,
                tp_disagreements=None if consistency is None else len(consistency.disagreements),
                problems=problems,
                attempt=job.attempts,
            )
            if not running.recorded:
                fenced = Outcome(
                    error_kind="lost_lease",
                    error="finished after its lease ran out and another claim took the job: not stored",
                )
                self._record_in(
                    session, running, "succeeded" if stored else "fenced", outcome if stored else fenced
                )
            disagreed = consistency is not None and bool(consistency.disagreements)
            if stored and consistency is not None and disagreed:
                self._report_disagreements(session, job, consistency)
            if stored and self._planner is not None:
                self._planner.after_result(session, job, metrics)
            if stored and self._alerter is not None:
                self._alerter.after_result(session, job, tp_disagreed=disagreed)
        running.recorded = True
        if stored and self._alerter is not None:
            self._alerter.after_commit()
        if stored and not Path(job.checkpoint_path).is_dir():
            # Rotated away after the worker had it in memory: the results stand, the folder is gone.
            with self._db.session() as session:
                reason = "deleted after it was evaluated"
                queries.mark_checkpoint(session, job.checkpoint_id, CheckpointState.VANISHED, reason)
            log.info("checkpoint.vanished", run=job.run, step=job.step, reason=reason)
        if stored and problems:
            self._report_problems(job, problems)
        if stored:
            values = {m.name: None if m.n == 0 else round(m.value, 4) for m in result.metrics}
            log.info(
                "job.succeeded", job_id=job.id, run=job.run, step=job.step, task=job.task, metrics=values
            )
        else:
            log.warning(
                "job.lost_lease",
                job_id=job.id,
                run=job.run,
                step=job.step,
                attempt=job.attempts,
                stored=False,
            )

    def _report_problems(self, job: queries.ClaimedJob, problems: list[queries.ProblemRow]) -> None:
        """Inputs left out of the metrics do not fail the job, so a warning is the only place they surface
        before someone reads them with ``evald samples``."""
        first = [
            report.one_line(f"{p.where}: {p.message}", PROBLEM_CHARS) for p in problems[:PROBLEMS_LOGGED]
        ]
        log.warning(
            "job.problems",
            job_id=job.id,
            run=job.run,
            step=job.step,
            task=job.task,
            stage=job.stage,
            count=len(problems),
            first=first,
        )

    def _report_disagreements(
        self, session: Session, job: queries.ClaimedJob, consistency: Consistency
    ) -> None:
        """A tp disagreement is stored as an event with the job's result (alerts are built from events)."""
        found = consistency.disagreements
        message = json.dumps(
            {
                "batches_checked": consistency.batches_checked,
                "disagreements": [d.model_dump() for d in found],
            }
        )
        store.add_event(
            session, kind="tp_disagreement", run_id=job.run_id, job_id=job.id, message=message, now=utcnow()
        )
        log.warning("job.tp_disagreement", job_id=job.id, run=job.run, step=job.step, batches=len(found))
        if self._alerter is not None:
            self._alerter.operational(
                session,
                job,
                rule="tp_disagreement",
                severity="warning",
                message=f"tp ranks generated different tokens in {len(found)} of "
                f"{consistency.batches_checked} batches (job {job.id}); results kept the majority's",
            )

    def _fail(
        self, job: queries.ClaimedJob, kind: str, message: str, duration: float | None, *, retry: bool = False
    ) -> None:
        with self._db.session() as session:
            self._fail_in(session, job, kind, message, duration, retry=retry)
        if not retry and self._alerter is not None:
            self._alerter.after_commit()
        event = "job.retrying" if retry else "job.failed"
        log.warning(
            event,
            job_id=job.id,
            run=job.run,
            step=job.step,
            task=job.task,
            attempt=job.attempts,
            kind=kind,
            error=message,
        )

    def _fail_in(
        self,
        session: Session,
        job: queries.ClaimedJob,
        kind: str,
        message: str,
        duration: float | None,
        *,
        retry: bool,
    ) -> bool:
        """Fail (or with ``retry`` requeue) the job in the caller's transaction, with its alert; False if
        the claim is no longer ours."""
        ours = queries.fail_job(
            session,
            job_id=job.id,
            owner=self._owner,
            kind=kind,
            error=message,
            duration_s=duration,
            retry=retry,
            attempt=job.attempts,
        )
        if kind == "checkpoint_vanished":
            queries.mark_checkpoint(session, job.checkpoint_id, CheckpointState.VANISHED, message)
        # A vanished checkpoint is the trainer rotating it away, not a problem to page anyone about.
        # Only for a job still ours: after a lost lease another daemon owns it and its outcome.
        if ours and not retry and kind != "checkpoint_vanished" and self._alerter is not None:
            self._alerter.operational(
                session,
                job,
                rule="eval_failed",
                severity="warning",
                message=f"job {job.id} ({job.task}/{job.stage} at step {job.step}) failed after "
                f"{job.attempts} attempt(s): {kind}: {report.one_line(message, 300)}",
            )
        return ours

    def shutdown(self, grace_secs: float) -> None:
        """Let running jobs finish within ``grace_secs``, then kill and requeue the rest.

        With the database away, what cannot be stored is logged and left: the jobs stay ``running`` under
        this daemon until their lease hands them to the next one.
        """
        self._stopping = True
        self._leave_to_scheduler()
        deadline = time.monotonic() + grace_secs
        while (self.running or self._finished) and time.monotonic() < deadline:
            with contextlib.suppress(DatabaseUnreachable):
                self.poll()
            time.sleep(0.1)
        for job_id, running in list(self.running.items()):
            running.kill()
            running.finish()
            try:
                self._record(running, "requeued", Outcome(error_kind="shutdown", error="daemon stopped"))
                with self._db.session() as session:
                    queries.requeue_job(
                        session, job_id=job_id, owner=self._owner, attempt=running.job.attempts
                    )
            except DatabaseUnreachable as exc:
                log.error("job.not_requeued", job_id=job_id, run=running.job.run, error=str(exc))
                continue
            log.info("job.requeued", job_id=job_id, run=running.job.run, step=running.job.step)
        self.running.clear()
        for running, _ in self._finished:
            log.error(
                "job.unrecorded",
                job_id=running.job.id,
                run=running.job.run,
                result=str(running.spec.result_path),
                reason="the database did not answer before the daemon stopped",
            )
        self._finished.clear()


def _stored_handle(orphan: jobs_store.Orphan, kind: str) -> Handle | None:
    """The handle stored on an orphan's claim, if it is this claim's and this executor's."""
    if not orphan.executor_handle:
        return None
    try:
        handle = Handle.from_json(orphan.executor_handle)
    except (ValueError, KeyError, TypeError):
        return None
    if handle.executor != kind or handle.attempt != orphan.attempts or handle.job_id != orphan.id:
        return None
    return handle
