"""Handing attempts to their executor and following them: start or submit, poll, time out, re-attach.

A job's folder gets its ``spec.json`` (an earlier worker's result and rank logs removed: a job given back
at shutdown reuses its folder), then the executor takes it. A local worker is asked every pass and killed
at ``job_timeout_secs``. A job handed to a scheduler (Slurm) is polled every ``poll_secs``; its handle is
stored on the job (``executor_handle``) as soon as ``sbatch`` answers, and a daemon that restarts or takes
over a dead daemon's claim re-attaches to the queued or running submission (:meth:`Dispatcher.reattach`),
finding one whose id was never stored by its name and comment, so that nothing is submitted twice. An
attempt's end goes to the runner's ``finished`` list; no database is touched while polling.

A submission carries its job's :class:`~daemon.running.retries.RetryPlan`, made from the job's history
as it is handed over: a longer time limit after a TIMEOUT, the nodes of a NODE_FAIL kept out, the
preemptions so far. A refusal of ``sbatch`` for the config's sake (:class:`ExecutorMisconfigured`)
fails no job: it goes back to the queue and claiming pauses until the config (or the cluster) is fixed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.config import Config
from daemon.running import remote, retries
from daemon.running.attempt import Attempt, Stage
from daemon.running.executor_watch import ExecutorWatch
from daemon.running.executors.base import (
    Active,
    Ended,
    Executor,
    ExecutorError,
    ExecutorMisconfigured,
    ExecutorUnavailable,
    Handle,
    JobRef,
    Phase,
)
from daemon.running.executors.local import LOG_NAME
from daemon.running.queue import SCRATCH_FULL, JobQueue
from daemon.running.recording import Recorder
from daemon.running.workers import Outcome, read_outcome
from inference.spec import JobSpec
from storage import queries
from storage.database import Database
from storage.models import utcnow

log = structlog.get_logger("evald.runner")


def read_end(spec: JobSpec, ended: Ended, *, detached: bool) -> Outcome:
    """The runner's outcome of an attempt its executor says ended, from the job's files."""
    if detached:
        return remote.outcome_of(ended, spec)
    if ended.exit_code is None:
        return Outcome(error_kind="lost", error=ended.detail)
    return read_outcome(spec, ended.exit_code, spec.result_path.parent / LOG_NAME)


def write_folder(spec: JobSpec) -> Path:
    """The job's folder with its ``spec.json`` (and nothing an earlier worker left); the spec's path."""
    job_dir = spec.result_path.parent
    job_dir.mkdir(parents=True, exist_ok=True)
    # A job given back at shutdown reuses its folder: nothing an earlier worker left may be read as
    # this one's.
    for stale in (*job_dir.glob("result*.json"), *job_dir.glob("rank-*.log")):
        stale.unlink(missing_ok=True)
    spec_path = job_dir / "spec.json"
    spec_path.write_text(spec.model_dump_json(indent=1), encoding="utf-8")
    return spec_path


def ref(attempt: Attempt) -> JobRef:
    job = attempt.job
    return JobRef(job.id, job.attempts, job.run, job.task)


def epoch(moment: datetime) -> float:
    """Seconds since the epoch of a stored time (naive on SQLite: UTC)."""
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def retry_plan(session: Session, job_id: int, executor: Executor) -> retries.RetryPlan | None:
    """The plan of the job's attempt from its history, for an executor with time limits of its own."""
    limits = executor.time_limits()
    if limits is None:
        return None
    history = queries.job_history(session, job_id)
    return retries.plan(history, time_limit_s=limits[0], max_time_limit_s=limits[1])


class Dispatcher:
    """Starts and follows one runner's attempts (see the module's docstring)."""

    def __init__(
        self,
        database: Database,
        owner: str,
        *,
        running: dict[int, Attempt],
        finished: list[tuple[Attempt, Outcome]],
        watch: ExecutorWatch,
        queue: JobQueue,
        recorder: Recorder,
        scratch_full: Callable[[queries.ClaimedJob, OSError], None],
    ) -> None:
        self._db = database
        self._owner = owner
        #: The runner's attempts in flight, and those ended whose outcome is not stored yet.
        self._running = running
        self._finished = finished
        self._watch = watch
        self._queue = queue
        self._recorder = recorder
        self._scratch_full = scratch_full
        #: The config new claims run under (its ``poll_secs`` spaces a new submission's first poll).
        self.config: Config | None = None

    # --- handing over ---------------------------------------------------------------------------------

    def launch(
        self, job: queries.ClaimedJob, spec: JobSpec, config: Config, executor: Executor, since: float | None
    ) -> None:
        """Hand ``job`` to ``executor``: a worker started here, or a submission (see :meth:`_submit`)."""
        if executor.detached:
            self._submit(job, spec, since, config, executor)
            return
        try:
            spec_path = write_folder(spec)
            handle = executor.start(spec_path, JobRef(job.id, job.attempts, job.run, job.task))
        except OSError as exc:
            if exc.errno in SCRATCH_FULL:
                self._scratch_full(job, exc)
                return
            self._recorder.fail(job, "setup", f"could not start worker: {exc}", None)
            return
        except Exception as exc:
            self._recorder.setup_failed(job, exc)
            return
        attempt = Attempt(job, spec, config, executor, started=since or time.monotonic(), handle=handle)
        attempt.move(Stage.STARTED)
        attempt.move(Stage.RUNNING)
        self._running[job.id] = attempt
        self._queue.room_again(config.daemon.state_dir)
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

    def _submit(
        self, job: queries.ClaimedJob, spec: JobSpec, since: float | None, config: Config, executor: Executor
    ) -> None:
        """Write the job's folder under the executor's ``job_dir`` and submit it; its handle is stored on
        the job before the runner moves on (or, with the database away, at the next poll)."""
        try:
            write_folder(spec)
        except OSError as exc:
            job_dir = spec.result_path.parent
            self._recorder.fail(job, "setup", f"could not write the job folder {job_dir}: {exc}", None)
            return
        with self._db.session() as session:
            plan = retry_plan(session, job.id, executor)
        attempt = Attempt(job, spec, config, executor, started=since or time.monotonic(), plan=plan)
        self._running[job.id] = attempt
        self._hand_over(attempt)
        if attempt.handle is not None and job.id in self._running:
            self._record_handle(attempt)

    def _poll_secs(self) -> float:
        assert self.config is not None
        return self.config.executor.poll_secs

    def _hand_over(self, attempt: Attempt) -> None:
        """``sbatch`` the job's folder, with its plan's adjustments. Refused: when the config is at fault
        (a partition, feature, GRES, account or QoS Slurm does not have) the job goes back to the queue
        and claiming pauses; otherwise the job fails with sbatch's words. Unanswered: the handle stays
        unknown and the next poll finds the submission or submits again."""
        assert attempt.executor is not None
        job, spec = attempt.job, attempt.spec
        adjust = attempt.plan.adjustments() if attempt.plan is not None else None
        try:
            handle = attempt.executor.start(spec.result_path.parent / "spec.json", ref(attempt), adjust)
        except ExecutorUnavailable as exc:
            self._watch.away(str(exc))
            attempt.handle = None
            attempt.move(Stage.STARTED)
            attempt.next_poll = time.monotonic() + self._poll_secs()
            return
        except (ExecutorError, OSError) as exc:
            del self._running[job.id]
            attempt.finish()
            self._rejected(attempt, exc)
            return
        self._watch.back()
        attempt.handle = handle
        attempt.move(Stage.STARTED)
        attempt.handle_recorded = False
        attempt.next_poll = time.monotonic() + self._poll_secs()
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

    def _rejected(self, attempt: Attempt, exc: Exception) -> None:
        """``sbatch`` refused the job. When the config is at fault (the refusal names a setting, or the
        executor's check fails too: the partition is gone) the job goes back to the queue without
        spending an attempt and claiming pauses until it is fixed; otherwise the job is to blame and
        fails with what Slurm said."""
        job, error = attempt.job, str(exc)
        misconfigured = isinstance(exc, ExecutorMisconfigured)
        if misconfigured:
            self._watch.refused(error)
        if misconfigured or (self._watch.detached and not self._watch.check()):
            self._recorder.record(attempt, "requeued", Outcome(error_kind="executor_unusable", error=error))
            self._recorder.requeue(job)
            return
        self._recorder.record(attempt, "failed", Outcome(error_kind="rejected", error=error))
        self._recorder.fail(job, "rejected", error, None)

    def _record_handle(self, attempt: Attempt) -> None:
        job = attempt.job
        handle = None if attempt.handle is None else attempt.handle.to_json()
        with self._db.session() as session:
            held = queries.record_handle(
                session, job_id=job.id, owner=self._owner, attempt=job.attempts, handle=handle
            )
        attempt.handle_recorded = True
        if not held:
            log.warning("job.handle_unrecorded", job_id=job.id, reason="the claim is no longer this daemon's")

    # --- following --------------------------------------------------------------------------------------

    def poll(self, now: float) -> None:
        """Ask each executor about its attempts: ended ones go to ``finished``, a local worker past its
        timeout is killed. No database here."""
        self._poll_detached(now)
        for job_id, attempt in list(self._running.items()):
            if attempt.detached or attempt.executor is None or attempt.handle is None:
                continue
            status = attempt.executor.poll(attempt.handle)
            if isinstance(status, Active):
                timeout = attempt.config.inference.job_timeout_secs
                if now - attempt.started > timeout:
                    attempt.executor.cancel(attempt.handle)
                    del self._running[job_id]
                    outcome = Outcome(error_kind="timeout", error=f"worker killed after {timeout:g} s")
                    attempt.finish()
                    self._finished.append((attempt, outcome))
                continue
            del self._running[job_id]
            attempt.finish()
            self._finished.append((attempt, self._outcome(attempt, status)))

    @staticmethod
    def _outcome(attempt: Attempt, ended: Ended) -> Outcome:
        try:
            return read_end(attempt.spec, ended, detached=attempt.detached)
        except Exception as exc:
            # Files no reader expected (a result that is not a file, say): the job's problem.
            where = "the job's files" if attempt.detached else "the worker's files"
            return Outcome(error_kind="result_unreadable", error=f"reading {where}: {exc!r}")

    @staticmethod
    def stop(attempt: Attempt) -> None:
        """Kill a worker of the daemon's own. A scheduler's job is cancelled on purpose only
        (:func:`daemon.running.lease.cancel`), never as a side effect: it outlives its daemon, and the
        next one re-attaches to it."""
        if not attempt.detached and attempt.executor is not None and attempt.handle is not None:
            attempt.executor.cancel(attempt.handle)

    def _poll_detached(self, now: float) -> None:
        """Ask the executor about each job handed to it that is due (``poll_secs``). The first unanswered
        question ends the round: the others would wait for the same controller. While it is away each
        question waits for it (about 8 s: the tools' own retries), so every job's next one is counted
        from the end of the unanswered one: the loop is free for at least ``poll_secs`` between them."""
        due = [a for a in self._running.values() if a.detached and now >= a.next_poll]
        if not self._watch.tick(now, jobs_due=bool(due)):
            return
        for attempt in due:
            attempt.next_poll = now + attempt.config.executor.poll_secs
            try:
                self._poll_one(attempt)
            except ExecutorUnavailable as exc:
                self._watch.away(str(exc))
                after = time.monotonic()
                for waiting in self._running.values():
                    if waiting.detached:
                        waiting.next_poll = max(waiting.next_poll, after + waiting.config.executor.poll_secs)
                self._watch.next_probe = after + self._poll_secs()
                return
            self._watch.back()

    def _poll_one(self, attempt: Attempt) -> None:
        executor, job = attempt.executor, attempt.job
        assert executor is not None
        if attempt.handle is None:
            found = executor.find(ref(attempt), since=epoch(attempt.started_at))
            if found is not None:
                # Its folder is this attempt's (an out-of-memory rerun has one of its own).
                found = dataclasses.replace(found, job_dir=attempt.spec.result_path.parent)
            if found is None:
                log.info(
                    "job.resubmitting", job_id=job.id, attempt=job.attempts, reason="sbatch did not answer"
                )
                self._hand_over(attempt)
                return
            attempt.handle, attempt.handle_recorded = found, False
            log.info("job.reattached", job_id=job.id, attempt=job.attempts, slurm_job_id=found.external_id)
            return
        status = executor.poll(attempt.handle)
        attempt.placement = status.placement
        if isinstance(status, Active):
            state = remote.state_line(status)
            if state != attempt.state:
                log.info(
                    "job.scheduler_state",
                    job_id=job.id,
                    slurm_job_id=attempt.handle.external_id,
                    state=state,
                    reason=status.reason,
                )
            attempt.state = state
            if status.phase is Phase.RUNNING:
                attempt.move(Stage.RUNNING)
            if status.phase in (Phase.PENDING, Phase.REQUEUED):
                attempt.move(Stage.STARTED)
                gone = self._gone(attempt)
                if gone is not None:
                    executor.cancel(attempt.handle)
                    attempt.exit_state = "CANCELLED"
                    self._ended(attempt, Outcome(error_kind=gone[0], error=gone[1]))
            return
        attempt.exit_state = status.placement.state or status.kind.value.upper()
        self._ended(attempt, self._outcome(attempt, status))

    def _ended(self, attempt: Attempt, outcome: Outcome) -> None:
        del self._running[attempt.job.id]
        attempt.finish()
        self._finished.append((attempt, outcome))

    def _gone(self, attempt: Attempt) -> tuple[str, str] | None:
        """Why a queued job should not run any more: its checkpoint deleted, or its run removed from the
        config; None while it should."""
        job = attempt.job
        run_ids = self._queue.run_ids
        if run_ids is not None and job.run_id not in run_ids:
            return "run_removed", f"run {job.run!r} was removed from the config while job {job.id} was queued"
        if not Path(job.checkpoint_path).is_dir():
            return (
                "checkpoint_vanished",
                f"{job.checkpoint_path} was deleted while job {job.id} was queued in Slurm: cancelled",
            )
        return None

    def bookkeeping(self) -> None:
        """Store what the database does not know yet of the jobs handed to a scheduler: a handle
        (a submission found again, or one made while the database was away) and the scheduler's state."""
        for attempt in list(self._running.values()):
            if not attempt.detached:
                continue
            if attempt.handle is not None and not attempt.handle_recorded:
                self._record_handle(attempt)
            if attempt.state is not None and attempt.state != attempt.state_recorded:
                job = attempt.job
                with self._db.session() as session:
                    queries.set_executor_state(
                        session, job_id=job.id, owner=self._owner, attempt=job.attempts, state=attempt.state
                    )
                attempt.state_recorded = attempt.state

    def leave_to_scheduler(self) -> None:
        """At shutdown: jobs in Slurm go on there; their claims stay, and the next daemon re-attaches."""
        for job_id, attempt in list(self._running.items()):
            if not attempt.detached:
                continue
            del self._running[job_id]
            log.info(
                "job.left_to_scheduler",
                job_id=job_id,
                run=attempt.job.run,
                attempt=attempt.job.attempts,
                slurm_job_id=attempt.handle.external_id if attempt.handle is not None else None,
                recorded=attempt.handle_recorded,
            )

    def reattach(self, session: Session, orphan: queries.Orphan, config: Config) -> bool:
        """Take over an orphan (a dead daemon's claim, locked by :func:`queries.orphans`) whose Slurm job
        is still known: by the handle stored on it, else found by name and comment; True when taken (it
        is polled from now on and nothing is submitted again), False to recover it as usual. With the
        controller away and a job folder for the claim, the claim is taken and its submission looked
        for once the controller answers."""
        executor = self._watch.executor
        if not executor.detached:
            return False
        job_ref = JobRef(orphan.id, orphan.attempts)
        handle = stored_handle(orphan, executor.kind)
        recorded = handle is not None
        how = "recorded"
        since = epoch(orphan.started_at) if orphan.started_at is not None else None
        if handle is None:
            try:
                handle = executor.find(job_ref, since=since)
                how = "found by name"
            except ExecutorUnavailable as exc:
                self._watch.away(str(exc))
                how = "to be found"
        folder = handle.job_dir if handle is not None else executor.job_folder(job_ref)
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
            queries.record_handle(
                session, job_id=job.id, owner=self._owner, attempt=job.attempts, handle=handle.to_json()
            )
        attempt = Attempt(
            job,
            spec,
            config,
            executor,
            stage=Stage.STARTED,
            started_at=orphan.started_at or utcnow(),
            handle=handle,
            handle_recorded=handle is not None,
            plan=retry_plan(session, job.id, executor),
        )
        self._running[job.id] = attempt
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


def stored_handle(orphan: queries.Orphan, kind: str) -> Handle | None:
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
