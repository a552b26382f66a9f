"""Recording how attempts end: a result stored, a job failed, retried or requeued, each worker run's
history row, and a job whose end the database refuses (poisoned) failed alone.

A result, its samples, ``succeeded``, the history row, the planner's follow-ups and the anomaly alerts
commit in one transaction. Every write is under the claim that holds the job (its attempt number is the
fencing token): the end of a claim that is no longer the job's stores nothing and its run is recorded
``fenced``. An error of one job is that job's: it fails (kind ``store_failed``, ``setup``) in a fresh
transaction with its alert; only :class:`DatabaseUnreachable` goes up, so the runner keeps the outcome.
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.alerts.lifecycle import Alerter
from daemon.analysis.report.cells import one_line
from daemon.running.attempt import Attempt
from daemon.running.workers import Outcome
from daemon.scheduling.planner import Planner
from inference.spec import Consistency, JobResult
from storage import queries
from storage import scheduling as store
from storage.database import Database, reason
from storage.errors import DatabaseUnreachable
from storage.models import CheckpointState, utcnow

log = structlog.get_logger("evald.runner")

#: How much of a poisoned job's error (the database's own words) is kept on the job.
POISON_ERROR_CHARS = 2000

#: How many of a stored result's problems its ``job.problems`` warning quotes (``evald samples`` lists all),
#: and how much of each.
PROBLEMS_LOGGED = 5
PROBLEM_CHARS = 200


class Recorder:
    """Writes the ends of one runner's attempts (see the module's docstring)."""

    def __init__(
        self, database: Database, owner: str, *, planner: Planner | None, alerter: Alerter | None
    ) -> None:
        self._db = database
        self._owner = owner
        #: Plans the follow-ups of a stored result (full stage, adaptive interval) in its transaction.
        self.planner = planner
        #: Detects anomalies in a stored result's series and queues their alerts, in its transaction.
        self.alerter = alerter

    # --- history rows ---------------------------------------------------------------------------------

    def record(self, attempt: Attempt, outcome: str, ended: Outcome) -> None:
        """The worker run's history row, once."""
        if attempt.recorded:
            return
        with self._db.session() as session:
            self.record_in(session, attempt, outcome, ended)
        attempt.recorded = True

    @staticmethod
    def record_in(session: Session, attempt: Attempt, outcome: str, ended: Outcome) -> None:
        """The worker run's history row, in the caller's transaction."""
        spec = attempt.spec
        now = attempt.ended_at or utcnow()
        queries.record_attempt(
            session,
            queries.AttemptRow(
                job_id=attempt.job.id,
                attempt=attempt.job.attempts,
                engine=spec.inference.engine,
                tp=spec.inference.tp,
                dp=spec.inference.dp,
                batch_size=spec.task.batch_size,
                outcome=outcome,
                error_kind=ended.error_kind,
                error=ended.error or None,
                started_at=attempt.started_at,
                finished_at=now,
                duration_s=(now - attempt.started_at).total_seconds(),
                slurm_job_id=attempt.handle.external_id if attempt.detached and attempt.handle else None,
                nodes=attempt.placement.nodes or None,
                queue_wait_s=attempt.placement.queue_wait_s,
                run_s=attempt.placement.run_s,
                exit_state=attempt.exit_state,
            ),
            replaces_lost=outcome == "fenced",
        )

    # --- the job's state ------------------------------------------------------------------------------

    def requeue(
        self, job: queries.ClaimedJob, *, error_kind: str | None = None, error: str | None = None
    ) -> None:
        """Give the job back to the queue without spending its attempt."""
        with self._db.session() as session:
            queries.requeue_job(
                session,
                job_id=job.id,
                owner=self._owner,
                attempt=job.attempts,
                error_kind=error_kind,
                error=error,
            )

    def fail(
        self, job: queries.ClaimedJob, kind: str, message: str, duration: float | None, *, retry: bool = False
    ) -> None:
        with self._db.session() as session:
            self.fail_in(session, job, kind, message, duration, retry=retry)
        if not retry and self.alerter is not None:
            self.alerter.after_commit()
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

    def fail_in(
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
        if ours and not retry and kind != "checkpoint_vanished" and self.alerter is not None:
            self.alerter.operational(
                session,
                job,
                rule="eval_failed",
                severity="warning",
                message=f"job {job.id} ({job.task}/{job.stage} at step {job.step}) failed after "
                f"{job.attempts} attempt(s): {kind}: {one_line(message, 300)}",
            )
        return ours

    def setup_failed(self, job: queries.ClaimedJob, exc: Exception) -> None:
        """A spec the config cannot build for this job, or a worker that cannot be started (a bug, a
        value no check foresaw): this job's failure."""
        message = f"could not start worker: {type(exc).__name__}: {reason(exc)}"
        try:
            self.fail(job, "setup", message, None)
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

    # --- a result ---------------------------------------------------------------------------------------

    def store(self, attempt: Attempt, outcome: Outcome, result: JobResult, duration: float) -> None:
        """The results, samples, ``succeeded`` and the worker run's history row, in one transaction; under
        a claim no longer ours (a stale token) nothing is stored and the run is recorded ``fenced``."""
        job = attempt.job
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
            if not attempt.recorded:
                fenced = Outcome(
                    error_kind="lost_lease",
                    error="finished after its lease ran out and another claim took the job: not stored",
                )
                self.record_in(
                    session, attempt, "succeeded" if stored else "fenced", outcome if stored else fenced
                )
            disagreed = consistency is not None and bool(consistency.disagreements)
            if stored and consistency is not None and disagreed:
                self._report_disagreements(session, job, consistency)
            if stored and self.planner is not None:
                self.planner.after_result(session, job, metrics)
            if stored and self.alerter is not None:
                self.alerter.after_result(session, job, tp_disagreed=disagreed)
        attempt.recorded = True
        if stored:
            self._after_stored(job, result, problems)
        else:
            log.warning(
                "job.lost_lease",
                job_id=job.id,
                run=job.run,
                step=job.step,
                attempt=job.attempts,
                stored=False,
            )

    def _after_stored(
        self, job: queries.ClaimedJob, result: JobResult, problems: list[queries.ProblemRow]
    ) -> None:
        """After a result's commit: its alerts sent on, its checkpoint marked vanished when it was rotated
        away meanwhile, its left-out inputs and its success said."""
        if self.alerter is not None:
            self.alerter.after_commit()
        if not Path(job.checkpoint_path).is_dir():
            # Rotated away after the worker had it in memory: the results stand, the folder is gone.
            with self._db.session() as session:
                why = "deleted after it was evaluated"
                queries.mark_checkpoint(session, job.checkpoint_id, CheckpointState.VANISHED, why)
            log.info("checkpoint.vanished", run=job.run, step=job.step, reason=why)
        if problems:
            self._report_problems(job, problems)
        values = {m.name: None if m.n == 0 else round(m.value, 4) for m in result.metrics}
        log.info("job.succeeded", job_id=job.id, run=job.run, step=job.step, task=job.task, metrics=values)

    def _report_problems(self, job: queries.ClaimedJob, problems: list[queries.ProblemRow]) -> None:
        """Inputs left out of the metrics do not fail the job, so a warning is the only place they surface
        before someone reads them with ``evald samples``."""
        first = [one_line(f"{p.where}: {p.message}", PROBLEM_CHARS) for p in problems[:PROBLEMS_LOGGED]]
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
        if self.alerter is not None:
            self.alerter.operational(
                session,
                job,
                rule="tp_disagreement",
                severity="warning",
                message=f"tp ranks generated different tokens in {len(found)} of "
                f"{consistency.batches_checked} batches (job {job.id}); results kept the majority's",
            )

    # --- a job the database refuses ---------------------------------------------------------------------

    def poisoned(self, attempt: Attempt, exc: Exception, *, doing: str = "storing its result") -> None:
        """The job whose outcome could not be stored (the database refused it, or a bug on the way) fails
        with the database's own words, in a fresh transaction, with its ``eval_failed`` alert: one
        ``job.failed`` line, and the loop goes on. Raises only :class:`DatabaseUnreachable` (the job is
        then tried again, from the start, when the database answers)."""
        job = attempt.job
        kind = "store_failed"
        message = one_line(f"{doing} failed: {type(exc).__name__}: {reason(exc)}", POISON_ERROR_CHARS)
        duration = attempt.duration()
        try:
            with self._db.session() as session:
                if not attempt.recorded:
                    self.record_in(session, attempt, "failed", Outcome(error_kind=kind, error=message))
                ours = self.fail_in(session, job, kind, message, duration, retry=False)
            attempt.recorded = True
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
                _unrecordable(attempt, message, exc, last)
                return
            message = f"{message} (and recording it: {type(again).__name__}: {reason(again)})"
        if self.alerter is not None:
            self.alerter.after_commit()
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


def _unrecordable(attempt: Attempt, message: str, exc: Exception, last: Exception) -> None:
    """Said when not even the job's failed state could be stored: the job stays running until its lease
    (or the next start) gives it back."""
    job = attempt.job
    log.error(
        "job.unrecordable",
        job_id=job.id,
        run=job.run,
        step=job.step,
        task=job.task,
        error=message,
        also=f"{type(last).__name__}: {reason(last)}",
        result=str(attempt.spec.result_path),
        action="left running: its lease (or the next start) gives it back, within max_attempts",
        exc_info=exc,
    )
