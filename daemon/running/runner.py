"""Runs claimed jobs through their executor and stores what they return: the loop's one entry point.

The runner ties the parts of :mod:`daemon.running` together: :mod:`.job_queue` says whether and what to
claim, :mod:`.dispatch` hands each attempt to its executor (:mod:`.executors`: worker processes here, or
Slurm) and follows it, :mod:`.attempt` says what an attempt's end becomes, :mod:`.recording` writes it,
and :mod:`.lease` keeps each claim's lease fresh and handles one that was lost. A job whose checkpoint is
in object storage is first downloaded, off the loop (:mod:`.fetches`), and started once its copy is there.

The worker is a separate process group: a crash, an OOM or a hang stays there. The daemon reads only its
exit status and result files, and stores the results, the samples and the ``succeeded`` state in one
transaction, so a job is either wholly stored or not at all (and then runs again).

A worker that runs out of memory is started again at once with half the batch size, down to 1; one that
crashes (a rank dies) or times out gives its job back to the queue until ``max_attempts`` tries are
spent; a rejected input fails the job at once. Every worker run is kept in the job's history. Through a
scheduler (:mod:`.retries`): a TIMEOUT's retry gets a longer time limit (at the most a job may have, the
job fails), a NODE_FAIL's keeps its nodes out, and a preemption spends no attempt (``free_preemptions``
in a row).

An error of one job is that job's, never the runner's (:class:`.recording.Recorder`). Only the database
being away holds a job in memory, to be stored when it answers. Each claim's attempt number is its
fencing token: a result, a failure or a heartbeat is written only under the claim that holds the job, so
a daemon whose lease ran out can never double a result (its attempt is recorded as ``fenced``).

With ``[executor] kind = "slurm"`` a claimed job is submitted (``sbatch``) instead of started here, and
polled every ``poll_secs`` (see :mod:`daemon.running.remote` for what each end becomes); a daemon that
restarts re-attaches to it (:meth:`JobRunner.reattach`). A stopping daemon leaves its jobs to the
scheduler. A controller that does not answer pauses claiming (:mod:`.executor_watch`).
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

import structlog
from sqlalchemy.orm import Session

from daemon.alerts.lifecycle import Alerter
from daemon.config import Config
from daemon.errors import JobSetupError
from daemon.running import lease, retries
from daemon.running.attempt import Attempt, Verdict, verdict
from daemon.running.dispatch import Dispatcher
from daemon.running.executor_watch import ExecutorWatch
from daemon.running.executors.base import JobRef
from daemon.running.fetches import Fetches, object_run
from daemon.running.job_queue import SCRATCH_FULL, JobQueue, build_spec, halved
from daemon.running.recording import Recorder
from daemon.running.workers import Outcome
from daemon.scheduling.planner import Planner
from daemon.scheduling.resources import ResourceProbe
from inference.spec import JobSpec
from storage import queries
from storage.database import Database
from storage.errors import DatabaseUnreachable
from storage.models import JobState, utcnow

log = structlog.get_logger("evald.runner")


class JobRunner:
    """Claims, runs and stores one daemon's jobs (see the module's docstring)."""

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
        self.running: dict[int, Attempt] = {}
        #: Workers that ended but whose outcome is not stored yet (the database was away): stored, in
        #: order, as soon as it answers. Their results are on disk and nothing else may store them.
        self._finished: list[tuple[Attempt, Outcome]] = []
        self._stopping = False
        self._recorder = Recorder(database, owner, planner=planner, alerter=alerter)
        self._queue = JobQueue(config, database, owner, planner=planner, probe=probe, alerter=alerter)
        self._watch = ExecutorWatch(config, jobs=lambda: len(self.running))
        self._dispatch = Dispatcher(
            database,
            owner,
            running=self.running,
            finished=self._finished,
            watch=self._watch,
            queue=self._queue,
            recorder=self._recorder,
            scratch_full=self._scratch_full,
        )
        self._dispatch.config = config
        #: Claimed jobs whose checkpoint is being downloaded from object storage.
        self._fetches = Fetches(
            database,
            owner,
            self._recorder,
            lambda job, spec, config: self._dispatch.launch(job, spec, config, self._watch.executor, None),
        )

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
        self._recorder.planner = planner
        self._recorder.alerter = alerter
        self._queue.reconfigure(config, planner=planner, probe=probe, alerter=alerter)
        self._watch.reconfigure(config)
        self._dispatch.config = config

    @property
    def executor_unusable(self) -> str | None:
        """Why the executor takes no job now (None: it does, or jobs run here)."""
        return self._watch.unusable

    @property
    def own_jobs(self) -> frozenset[int]:
        """Jobs this runner holds: downloading, running, or ended and waiting to be stored."""
        return (
            frozenset(self.running)
            | frozenset(a.job.id for a, _ in self._finished)
            | frozenset(self._fetches.under_way)
        )

    @property
    def fetching(self) -> frozenset[int]:
        """Claimed jobs whose checkpoint is being downloaded from object storage."""
        return frozenset(self._fetches.under_way)

    @property
    def unrecorded(self) -> int:
        """Jobs whose worker ended while the database was away, waiting to be stored."""
        return len(self._finished)

    @property
    def paused(self) -> bool:
        """Claiming waits for room in the state folder (see :meth:`_scratch_full`), or for the executor
        (its controller away, or unusable as configured), or for a submission's ``sbatch`` to answer."""
        return self._queue.out_of_room or self.executor_unusable is not None or self._dispatch.submitting

    def has_capacity(self) -> bool:
        if self.paused:
            return False
        # A job downloading its checkpoint holds its slot: it starts as soon as the copy is there.
        held = len(self.running) + len(self._fetches.under_way)
        if self._watch.detached:
            if held < self._config.executor.max_queued:
                return True
            self._queue.say_full()
            return False
        return held < self._config.scheduling.max_concurrent

    def resources_met(self) -> bool:
        """Check the thresholds; when unmet, defer every waiting job with the reason and return False."""
        busy = bool(self.running) or bool(self._fetches.under_way)
        return self._queue.resources_met(busy=busy, detached=self._watch.detached)

    def recheck_deferred(self) -> int:
        """The deferral re-check: release deferred jobs once the resources are there; returns how many."""
        if not self._queue.waiting(JobState.DEFERRED):
            return 0
        if not self.resources_met():
            return 0
        return self._queue.release_deferred()

    def report_stuck(self) -> int:
        """Housekeeping: a ``stuck`` event for each job deferred past ``stuck_after_secs``."""
        return self._queue.report_stuck()

    # --- claiming ---------------------------------------------------------------------------------------

    def claim_and_start(self) -> bool:
        """Claim the most urgent pending job and start its worker; False when the queue is empty or the
        resources are not there (the waiting jobs are then deferred)."""
        if not self._queue.waiting(JobState.PENDING, JobState.DEFERRED):
            return False
        if not self.resources_met():
            return False
        executor = self._watch.executor
        held = [a.job.run_id for a in self.running.values()]
        held += [f.job.run_id for f in self._fetches.under_way.values()]
        job = self._queue.claim(held, detached=executor.detached, resting=self._fetches.resting())
        if job is None:
            return False
        job_dir = executor.job_folder(JobRef(job.id, job.attempts))
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            spec = build_spec(self._config, job, job_dir)
        except OSError as exc:
            if exc.errno in SCRATCH_FULL:
                self._scratch_full(job, exc)
                return False
            self._recorder.fail(job, "setup", f"could not start worker: {exc}", None)
            return True
        except JobSetupError as exc:
            self._recorder.fail(job, "setup", f"could not start worker: {exc}", None)
            return True
        except Exception as exc:
            # A spec the config cannot build for this job (a bug, a value no check foresaw): this job's.
            self._recorder.setup_failed(job, exc)
            return True
        run = object_run(self._config, job)
        if run is not None:
            self._fetches.start(self._config, job, run, spec)
            return True
        self._dispatch.launch(job, spec, self._config, executor, None)
        return True

    def _scratch_full(self, job: queries.ClaimedJob, exc: OSError) -> None:
        """The state folder cannot take a job's files: the job goes back to the queue without spending an
        attempt, and claiming pauses (longer each time, up to a minute) until there is room again."""
        self._recorder.requeue(job)
        self._queue.pause_for_room()
        if self._queue.scratch_failures == 1:
            log.error(
                "scratch.full",
                state_dir=str(self._config.daemon.state_dir),
                job_id=job.id,
                error=str(exc),
                action="jobs wait in the queue until there is room",
            )

    def adopt(self, job: queries.ClaimedJob, spec: JobSpec, outcome: Outcome) -> None:
        """Take over a job whose daemon died after its worker had written the result: the next
        :meth:`poll` stores it (results, history, alerts) as if this daemon's worker had run it, instead
        of evaluating the checkpoint again."""
        timing = outcome.result.timing if outcome.result is not None else None
        took = timing.total_s if timing is not None else 0.0
        attempt = Attempt(
            job,
            spec,
            self._config,
            started=time.monotonic() - took,
            started_at=utcnow() - timedelta(seconds=took),
        )
        attempt.finish()
        self._finished.append((attempt, outcome))
        log.info("job.adopted", job_id=job.id, run=job.run, step=job.step, result=str(spec.result_path))

    def reattach(self, session: Session, orphan: queries.Orphan) -> bool:
        """Take over an orphan whose Slurm job is still known (see :meth:`Dispatcher.reattach`)."""
        return self._dispatch.reattach(session, orphan, self._config)

    # --- the loop's pass --------------------------------------------------------------------------------

    def poll(self) -> int:
        """Collect finished workers, kill timed-out ones, store what they returned, and keep the leases of
        the rest fresh.

        Returns how many jobs ended, each of which frees a slot. Workers are collected before anything
        touches the database, so while it is away (:class:`DatabaseUnreachable`, raised once the outcome
        is kept for the next call) timeouts still hold and nothing a worker wrote is lost.
        """
        before = len(self.running) + len(self._finished) + len(self._fetches.under_way)
        now = time.monotonic()
        self._dispatch.poll(now)
        rested = self._fetches.poll(now)
        while self._finished:
            attempt, outcome = self._finished[0]
            try:
                self._end(attempt, outcome)
            except DatabaseUnreachable:
                raise  # kept, in order, for the next call
            except Exception as exc:
                # This job's, not the loop's: it fails, and the ones behind it are stored.
                self._recorder.poisoned(attempt, exc)
            self._finished.pop(0)
        self._dispatch.bookkeeping()
        lease.renew(self._db, self._owner, self.running.values(), now, lost=self._lost, refused=self._refused)
        ended = before - len(self.running) - len(self._finished) - len(self._fetches.under_way)
        self._fetches.sweep(self._config.runs, self.own_jobs, now=ended > 0)
        # A run's rest that is over frees its jobs for claiming as a job's end frees a slot.
        return ended + rested

    def _end(self, attempt: Attempt, outcome: Outcome) -> None:
        """Store, retry or fail the job whose worker ended with ``outcome``; the run goes into its history."""
        if outcome.result is not None:
            self._recorder.store(attempt, outcome, outcome.result, attempt.duration())
            return
        kind = outcome.error_kind or "crash"
        step = self._verdict(attempt, kind)
        self._follow_verdict(attempt, _with_plan_note(attempt, outcome, kind, step), kind, step)

    def _verdict(self, attempt: Attempt, kind: str) -> Verdict:
        """What a failed attempt of ``kind`` becomes (:func:`verdict`, from its attempts and plan)."""
        plan = attempt.plan
        return verdict(
            kind,
            batch_size=attempt.spec.task.batch_size,
            attempt=attempt.job.attempts,
            max_attempts=attempt.config.inference.max_attempts,
            stopping=self._stopping,
            detached=attempt.detached,
            preemptions=plan.preemptions if plan is not None else 0,
            free_preemptions=attempt.config.executor.free_preemptions,
            at_time_cap=plan is not None and plan.at_time_cap,
        )

    def _follow_verdict(self, attempt: Attempt, outcome: Outcome, kind: str, step: Verdict) -> None:
        """Record the attempt as ``step`` says, and requeue, fail, retry or rerun its job."""
        job, record = attempt.job, self._recorder.record
        duration = attempt.duration()
        if step is Verdict.CANCEL_REQUEUE:
            record(attempt, "cancelled", outcome)
            self._recorder.requeue(job)
            log.info("job.cancelled", job_id=job.id, run=job.run, step=job.step, reason=outcome.error)
        elif step is Verdict.DISK_FULL:
            self._disk_full(attempt, outcome)
        elif step is Verdict.CANCEL_FAIL:
            record(attempt, "cancelled", outcome)
            self._recorder.fail(job, kind, outcome.error, duration)
        elif step is Verdict.PREEMPTED:
            record(attempt, "requeued", outcome)
            self._recorder.requeue(job, error_kind=kind, error=outcome.error)
            log.warning(
                "job.preempted",
                job_id=job.id,
                run=job.run,
                step=job.step,
                task=job.task,
                preemptions=(attempt.plan.preemptions if attempt.plan is not None else 0) + 1,
                free_preemptions=attempt.config.executor.free_preemptions,
                action="back in the queue without spending an attempt",
            )
        elif step is Verdict.TIME_CAP:
            record(attempt, "failed", outcome)
            self._recorder.fail(job, kind, outcome.error, duration)
        elif step is Verdict.REQUEUE:
            # Shutting down: the rerun would only be killed; the next claim starts it again.
            record(attempt, "requeued", outcome)
            self._recorder.requeue(job)
        elif step is Verdict.HALVE:
            record(attempt, "out_of_memory", outcome)
            self._rerun_halved(attempt)
        else:
            retry = step is Verdict.RETRY
            record(attempt, "retried" if retry else "failed", outcome)
            self._recorder.fail(job, kind, outcome.error, duration, retry=retry)

    def _rerun_halved(self, attempt: Attempt) -> None:
        """Out of memory: the job runs again at once with half its batch size, in a folder of its own."""
        job, spec = attempt.job, attempt.spec
        batch = spec.task.batch_size
        job_dir = spec.result_path.parent.with_name(f"{job.id}-{job.attempts}-batch{batch // 2}")
        log.warning(
            "job.out_of_memory",
            job_id=job.id,
            run=job.run,
            step=job.step,
            batch_size=batch,
            retry_batch_size=batch // 2,
        )
        executor = self._watch.executor
        if not executor.detached and attempt.executor is not None and not attempt.executor.detached:
            executor = attempt.executor  # a rerun here keeps the settings its claim started with
        self._dispatch.launch(job, halved(spec, job_dir), attempt.config, executor, attempt.started)

    def _disk_full(self, attempt: Attempt, outcome: Outcome) -> None:
        """The worker evaluated but found no room for its result: the host's fault, not the checkpoint's.
        The job goes back to the queue without spending an attempt, and claiming pauses (longer each time
        in a row, as for a full state folder) until there is room."""
        job = attempt.job
        self._recorder.record(attempt, "requeued", outcome)
        self._recorder.requeue(job, error_kind="disk_full", error=outcome.error)
        pause = self._queue.pause_for_room()
        log.error(
            "job.disk_full",
            job_id=job.id,
            run=job.run,
            step=job.step,
            task=job.task,
            error=outcome.error.splitlines()[0],
            action=f"requeued without spending an attempt; claiming pauses {pause:g} s",
        )

    def _refused(self, attempt: Attempt, exc: Exception) -> None:
        """The database refuses this job's heartbeat: it fails, and the others' leases stay fresh."""
        del self.running[attempt.job.id]
        self._dispatch.stop(attempt)
        attempt.finish()
        self._recorder.poisoned(attempt, exc, doing="refreshing its lease")

    def _lost(self, attempt: Attempt) -> None:
        """The job was taken from this daemon (its lease ran out and another claim holds it): the worker
        is stopped, its attempt is recorded as ``fenced``, and nothing it returns is stored."""
        job = attempt.job
        del self.running[job.id]
        if attempt.detached and lease.handed_over(self._db, attempt):
            return
        self._dispatch.stop(attempt)
        attempt.finish()
        note = "its lease ran out and another claim holds the job; the worker was stopped"
        self._recorder.record(attempt, "fenced", Outcome(error_kind="lost_lease", error=note))
        log.warning("job.lost_lease", job_id=job.id, run=job.run, step=job.step, attempt=job.attempts)

    def settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the executor's calls under way (``sbatch``, a poll, a check) and
        apply their answers, storing what they make known (a handle, a state): for a caller that needs
        the answers now, as a test does; the loop takes them at its next pass."""
        self._watch.calls.settle(timeout_s)
        self._dispatch.bookkeeping()

    def shutdown(self, grace_secs: float) -> None:
        """Let running jobs finish within ``grace_secs``, then kill and requeue the rest.

        With the database away, what cannot be stored is logged and left: the jobs stay ``running`` under
        this daemon until their lease hands them to the next one.
        """
        self._stopping = True
        self._dispatch.leave_to_scheduler()
        self._fetches.shutdown(wait_secs=5.0)
        deadline = time.monotonic() + grace_secs
        while (self.running or self._finished) and time.monotonic() < deadline:
            with contextlib.suppress(DatabaseUnreachable):
                self.poll()
            time.sleep(0.1)
        for job_id, attempt in list(self.running.items()):
            self._dispatch.stop(attempt)
            attempt.finish()
            try:
                self._recorder.record(
                    attempt, "requeued", Outcome(error_kind="shutdown", error="daemon stopped")
                )
                self._recorder.requeue(attempt.job)
            except DatabaseUnreachable as exc:
                log.error("job.not_requeued", job_id=job_id, run=attempt.job.run, error=str(exc))
                continue
            log.info("job.requeued", job_id=job_id, run=attempt.job.run, step=attempt.job.step)
        self.running.clear()
        for attempt, _ in self._finished:
            log.error(
                "job.unrecorded",
                job_id=attempt.job.id,
                run=attempt.job.run,
                result=str(attempt.spec.result_path),
                reason="the database did not answer before the daemon stopped",
            )
        self._finished.clear()
        self._watch.calls.close()


def _with_plan_note(attempt: Attempt, outcome: Outcome, kind: str, step: Verdict) -> Outcome:
    """``outcome`` with what the retry plan says of a detached attempt (preemptions so far, no more time
    given) added to its error: first where ``evald status`` should show it, else after the scheduler's."""
    plan = attempt.plan
    if plan is None or not attempt.detached:
        return outcome
    said = retries.note(
        kind,
        plan,
        nodes=attempt.placement.nodes,
        free_preemptions=attempt.config.executor.free_preemptions,
        spent=step is not Verdict.PREEMPTED,
        again=step in (Verdict.PREEMPTED, Verdict.RETRY),
    )
    if not said:
        return outcome
    # First where it is what `evald status` should show (its first line): how many
    # preemptions, or that no more time is given; else after the scheduler's line.
    first = kind == "preempted" or step is Verdict.TIME_CAP
    error = f"{said}\n{outcome.error}" if first else f"{outcome.error}\n{said}"
    return Outcome(error_kind=outcome.error_kind, error=error)
