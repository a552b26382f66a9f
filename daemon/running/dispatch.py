"""Handing attempts to their executor and following them: start or submit, poll, time out, re-attach.

A job's folder gets its ``spec.json`` (an earlier worker's result and rank logs removed: a job given back
at shutdown reuses its folder), then the executor takes it. A local worker is asked every pass and killed
at ``job_timeout_secs``. A job handed to a scheduler (Slurm) is submitted and polled every ``poll_secs``
on the executor's threads (:mod:`.executors.calls`: a controller that does not answer holds no pass), the
answers applied by the next pass; its folder is looked at every pass, so a success is stored as soon as
the script wrote ``exit.json`` (:class:`~.executors.base.ReadsFolder`). Its handle is stored on the job
(``executor_handle``) by the pass after ``sbatch`` answers, and a daemon that restarts or takes over a
dead daemon's claim re-attaches to the queued or running submission (:func:`.handover.reattach`),
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
import functools
import time
from collections.abc import Callable
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.config import Config
from daemon.running import handover, outages, remote
from daemon.running.attempt import Attempt, Stage
from daemon.running.executor_watch import ExecutorWatch, not_cancelled
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
    ReadsFolder,
    Status,
)
from daemon.running.executors.calls import Apply
from daemon.running.handover import epoch, read_end, ref, retry_plan, write_folder
from daemon.running.job_queue import SCRATCH_FULL, JobQueue
from daemon.running.recording import Recorder
from daemon.running.workers import Outcome
from inference.spec import JobSpec
from storage import queries
from storage.database import Database
from storage.errors import DatabaseUnreachable

log = structlog.get_logger("evald.runner")

#: How long a stopping daemon waits for the Slurm calls under way (a submission's handle, to be stored).
SETTLE_SECS = 5.0


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
        #: The threads a scheduler's tools run on (shared with the watch): no Slurm call on the loop.
        self._calls = watch.calls
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

    @property
    def submitting(self) -> bool:
        """A job's first ``sbatch`` has not answered yet: the next claim waits for it (a refusal for the
        config's sake would refuse the next job alike)."""
        return any(a.detached and a.stage is Stage.CLAIMED for a in self._running.values())

    def _poll_secs(self) -> float:
        assert self.config is not None
        return self.config.executor.poll_secs

    def _hand_over(self, attempt: Attempt) -> None:
        """``sbatch`` the job's folder on a thread, with its plan's adjustments; :meth:`_handed` applies
        the answer."""
        executor = attempt.executor
        assert executor is not None
        spec_path = attempt.spec.result_path.parent / "spec.json"
        job_ref = ref(attempt)
        adjust = attempt.plan.adjustments() if attempt.plan is not None else None

        def work() -> Apply:
            try:
                handle = executor.start(spec_path, job_ref, adjust)
            except (ExecutorError, ExecutorUnavailable, OSError) as exc:
                return functools.partial(self._handed, attempt, None, exc)
            return lambda: self._handed(attempt, handle, None)

        self._calls.start(("job", attempt.job.id), work)

    def _current(self, attempt: Attempt) -> bool:
        """Whether an answer about ``attempt`` still matters: it is followed (not ended meanwhile from
        its folder, nor lost with its lease, nor left to the scheduler at shutdown)."""
        return self._running.get(attempt.job.id) is attempt

    def _handed(self, attempt: Attempt, handle: Handle | None, error: Exception | None) -> None:
        """What ``sbatch`` said. Refused: when the config is at fault (a partition, feature, GRES,
        account or QoS Slurm does not have) the job goes back to the queue and claiming pauses; otherwise
        the job fails with sbatch's words. Unanswered: the handle stays unknown and the next poll finds
        the submission or submits again. Taken: its handle is stored by this pass's bookkeeping."""
        job = attempt.job
        if not self._current(attempt):
            if handle is not None and attempt.executor is not None:
                # Nobody follows it any more (the claim left this daemon meanwhile): it would only run.
                self._cancel_later(attempt.executor, handle)
            return
        if isinstance(error, ExecutorUnavailable):
            self._watch.away(str(error))
            attempt.handle = None
            attempt.move(Stage.STARTED)
            attempt.next_poll = time.monotonic() + self._poll_secs()
            return
        if error is not None or handle is None:
            del self._running[job.id]
            attempt.finish()
            self._rejected(attempt, error or ExecutorError("no handle"))
            return
        self._watch.back()
        attempt.handle = handle
        attempt.move(Stage.STARTED)
        attempt.handle_recorded = False
        attempt.next_poll = time.monotonic() + self._poll_secs()
        handover.say_submitted(attempt, handle, "answered")

    def _cancel_later(self, executor: Executor, handle: Handle) -> None:
        def work() -> Apply:
            try:
                executor.cancel(handle)
            except ExecutorUnavailable as exc:
                said = str(exc)
                return lambda: not_cancelled(handle, said)
            return lambda: None

        self._calls.start(("cancel", handle.external_id), work)

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
        """Ask the executor (on a thread) about each job handed to it that is due (``poll_secs``) and has
        no question pending; apply the answers that came. While its controller is away one question at a
        time is asked (each waits about 8 s: the tools' own retries), and every job's next one is counted
        from the end of the unanswered one."""
        self._calls.collect()
        self._ended_here()
        due = [
            a
            for a in self._running.values()
            if a.detached and now >= a.next_poll and not self._calls.busy(("job", a.job.id))
        ]
        if not self._watch.tick(now, jobs_due=bool(due)):
            return
        if self._watch.unreachable_since is not None:
            if self._calls.busy_any("job"):
                return
            due = due[:1]
        for attempt in due:
            attempt.next_poll = now + attempt.config.executor.poll_secs
            self._ask(attempt)

    def _ask(self, attempt: Attempt) -> None:
        """Poll the job on a thread; or, while whether ``sbatch`` queued it is unknown, look for it."""
        executor, handle, job_ref = attempt.executor, attempt.handle, ref(attempt)
        since = epoch(attempt.started_at)
        assert executor is not None

        def work() -> Apply:
            try:
                if handle is None:
                    found = executor.find(job_ref, since=since)
                    return lambda: self._found(attempt, found)
                status = executor.poll(handle)
            except ExecutorUnavailable as exc:
                return functools.partial(self._unanswered, attempt, exc)
            return lambda: self._polled(attempt, status)

        self._calls.start(("job", attempt.job.id), work)

    def _unanswered(self, attempt: Attempt, exc: ExecutorUnavailable) -> None:
        self._watch.away(str(exc))
        after = time.monotonic()
        for waiting in self._running.values():
            if waiting.detached:
                waiting.next_poll = max(waiting.next_poll, after + waiting.config.executor.poll_secs)
        self._watch.next_probe = after + self._poll_secs()

    def _ended_here(self) -> None:
        """Jobs whose folder already tells their success (Slurm's ``exit.json`` and a result): ended now,
        a stat each a pass, instead of at their next poll (``poll_secs`` later)."""
        for attempt in list(self._running.values()):
            executor = attempt.executor
            if not attempt.detached or attempt.handle is None or not isinstance(executor, ReadsFolder):
                continue
            ended = executor.ended_here(attempt.handle, attempt.placement)
            if ended is not None:
                attempt.placement = ended.placement
                attempt.exit_state = ended.placement.state or ended.kind.value.upper()
                self._ended(attempt, self._outcome(attempt, ended))

    def _found(self, attempt: Attempt, found: Handle | None) -> None:
        """What :meth:`Executor.find` said of a submission whose ``sbatch`` did not answer."""
        if not self._current(attempt):
            return
        self._watch.back()
        job = attempt.job
        if found is None:
            log.info(
                "job.resubmitting",
                job_id=job.id,
                attempt=job.attempts,
                reason="its submission went unanswered and the scheduler does not know it",
            )
            attempt.taken_over = None  # what is found from now on is this daemon's own submission
            self._hand_over(attempt)
            return
        # Its folder is this attempt's (an out-of-memory rerun has one of its own).
        found = dataclasses.replace(found, job_dir=attempt.spec.result_path.parent)
        attempt.handle, attempt.handle_recorded = found, False
        if attempt.taken_over is not None:
            log.info(
                "job.reattached",
                job_id=job.id,
                run=job.run,
                attempt=job.attempts,
                **found.logged(),
                how="found by name",
                was=attempt.taken_over,
            )
            return
        # This daemon's own submission, whose answer was lost: a submission, not a re-attachment.
        handover.say_submitted(attempt, found, "its answer was lost; found by name")

    def _polled(self, attempt: Attempt, status: Status) -> None:
        """What the executor said of a job: its state kept for ``evald status``, or its end."""
        if not self._current(attempt) or attempt.handle is None or attempt.executor is None:
            return
        self._watch.back()
        job, handle, executor = attempt.job, attempt.handle, attempt.executor
        attempt.placement = status.placement
        if isinstance(status, Ended):
            attempt.exit_state = status.placement.state or status.kind.value.upper()
            self._ended(attempt, self._outcome(attempt, status))
            return
        state = remote.state_line(status)
        if state != attempt.state:
            log.info(
                "job.scheduler_state",
                job_id=job.id,
                **handle.logged(),
                state=state,
                reason=status.reason,
            )
        attempt.state = state
        if status.phase is Phase.RUNNING:
            attempt.move(Stage.RUNNING)
        if status.phase not in (Phase.PENDING, Phase.REQUEUED):
            return
        attempt.move(Stage.STARTED)
        gone = self._gone(attempt)
        if gone is None:
            return

        def work() -> Apply:
            try:
                executor.cancel(handle)
            except ExecutorUnavailable as exc:
                return functools.partial(self._unanswered, attempt, exc)
            return lambda: self._cancelled(attempt, gone)

        self._calls.start(("job", job.id), work)

    def _cancelled(self, attempt: Attempt, why: tuple[str, str]) -> None:
        if self._current(attempt):
            attempt.exit_state = "CANCELLED"
            self._ended(attempt, Outcome(error_kind=why[0], error=why[1]))

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
        (a submission found again, or one made while the database was away) and the scheduler's state
        (unknown, since when, while its controller is away); and the controller's outages begun or
        ended."""
        news = self._watch.take_news()
        try:
            outages.record(self._db, news, self._owner)
        except DatabaseUnreachable:
            self._watch.give_back_news(news)  # told again at the next pass
            raise
        outages.mark_unknown(self._watch.outage, self._running.values())
        if self._watch.tidy_due():
            with self._db.session() as session:
                busy = set(queries.executor_states(session))
            self._watch.tidy(busy | set(self._running) | {a.job.id for a, _ in self._finished})
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
        """At shutdown: jobs in Slurm go on there; their claims stay, and the next daemon re-attaches.
        Submissions under way are given a few seconds to answer, so that their handles are stored."""
        if any(a.detached for a in self._running.values()):
            self._calls.settle(SETTLE_SECS)
            with contextlib.suppress(DatabaseUnreachable):
                self.bookkeeping()
        for job_id, attempt in list(self._running.items()):
            if not attempt.detached:
                continue
            del self._running[job_id]
            log.info(
                "job.left_to_scheduler",
                job_id=job_id,
                run=attempt.job.run,
                attempt=attempt.job.attempts,
                **(attempt.handle.logged() if attempt.handle is not None else {}),
                recorded=attempt.handle_recorded,
            )

    def reattach(self, session: Session, orphan: queries.Orphan, config: Config) -> bool:
        """Take over an orphan whose Slurm job is still known (see :func:`handover.reattach`)."""
        return handover.reattach(
            session, orphan, config, watch=self._watch, owner=self._owner, running=self._running
        )
