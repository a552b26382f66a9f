"""Turns ready checkpoints into jobs, as each run's frequency, backlog and two-stage policy say.

Every verdict is stored on the checkpoint with its reason (``not due: 10 steps since step 40,
freq_steps=20``), and the verdict, the counters it resets and the jobs it creates commit in one
transaction. Ready checkpoints are planned in step order, and a folder still incomplete holds nothing
back: a newer ready checkpoint is planned at once (a crashed save or a missing shard must not stall a run
for ``invalid_after_secs``). An older one that becomes ready later is judged against the evaluated
checkpoint before it, not the newest (see :meth:`Planner._late`), so it is evaluated where it would have
been in step order, and queued by the backlog policy.

The rules it applies are pure (:mod:`daemon.scheduling.policy`, :mod:`daemon.scheduling.frequency`); the
jobs they decide on are queued by :mod:`daemon.scheduling.enqueue`, and what a stored result sets off is
:mod:`daemon.scheduling.followups`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime

import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from daemon.config import SchedulingConfig
from daemon.scheduling import followups, frequency
from daemon.scheduling.enqueue import enqueue, enqueue_full
from daemon.scheduling.policy import RunPolicy, anchor, judge_late, late_refusal, quiet_limit
from daemon.watching.runs import WatchedRun
from inference import layouts
from storage import queries
from storage import scheduling as store
from storage.database import Database, reason
from storage.errors import DatabaseUnreachable
from storage.models import CheckpointState, Plan, utcnow

log = structlog.get_logger("evald.planner")

#: The base model's checkpoint name when ``eval_before_train`` is set (no folder under a root has it).
BASE_MODEL_NAME = "<base model>"


class Planner:
    def __init__(
        self,
        scheduling: SchedulingConfig,
        database: Database,
        runs: Iterable[WatchedRun],
        clock: Callable[[], datetime] = utcnow,
        on_reset: Callable[[str, datetime], None] | None = None,
    ) -> None:
        self._scheduling = scheduling
        self._db = database
        self._clock = clock
        #: Told when a run's counters reset, so its time trigger is re-armed from then.
        self._on_reset = on_reset
        self.policies = {
            run.config.name: RunPolicy(
                run, scheduling.frequency_for(run.config), scheduling.backlog_for(run.config)
            )
            for run in runs
        }
        now = clock()
        with database.session() as session:
            for policy in self.policies.values():
                store.ensure_schedule(session, policy.run_id, now)
                if policy.triggers.secs is None:
                    # Left waiting under a freq_secs since removed from the config: no tick will come.
                    reason = "not due: freq_secs is no longer set, so no time trigger will take it"
                    self._skip(session, policy, store.waiting(session, policy.run_id), reason, now)

    @property
    def oldest_first(self) -> frozenset[int]:
        return frozenset(p.run_id for p in self.policies.values() if p.backlog == "oldest_first")

    def anchors(self) -> dict[str, datetime]:
        with self._db.session() as session:
            rows = store.schedules(session)
        return {name: rows[name].anchor_at for name in self.policies if name in rows}

    # -- base model ---------------------------------------------------------------------------------

    def register_base_models(self) -> None:
        """Record each ``eval_before_train`` run's base model as a ready checkpoint at step 0."""
        for policy in self.policies.values():
            base = policy.config.base_model
            if not policy.config.eval_before_train or base is None:
                continue
            try:
                layout = layouts.detect(base, layouts.take_snapshot(base), policy.config.layout) or "hf"
            except OSError as exc:
                log.error("base_model.unreadable", run=policy.name, path=str(base), error=str(exc))
                continue
            with contextlib.suppress(IntegrityError), self._db.session() as session:
                # Another daemon sharing the database may record it at the same moment: theirs stands.
                if str(base) in queries.checkpoint_states(session, policy.run_id):
                    continue
                queries.record_checkpoint(
                    session,
                    run_id=policy.run_id,
                    path=str(base),
                    name=BASE_MODEL_NAME,
                    step=0,
                    epoch=0,
                    layout=layout,
                    state=CheckpointState.READY,
                    reason="eval_before_train: the base model, as step 0",
                )
                log.info("base_model.registered", run=policy.name, path=str(base), layout=layout)

    # -- planning -----------------------------------------------------------------------------------

    def plan(self) -> int:
        """Decide every ready checkpoint not yet planned; returns how many jobs were created."""
        created = 0
        for policy in self.policies.values():
            try:
                with self._db.session() as session:
                    created += self._plan_run(session, policy)
            except DatabaseUnreachable:
                raise
            except Exception as exc:
                # One run's planning refused (its transaction undone): its checkpoints stay unplanned in
                # the database, tried again at the next plan; the other runs are planned.
                log.error("planner.run_failed", run=policy.name, error=f"{type(exc).__name__}: {reason(exc)}")
        return created

    def _plan_run(self, session: Session, policy: RunPolicy) -> int:
        if not store.unplanned(session, policy.run_id):
            return 0
        # Lock the run's counters, then read again: a daemon sharing the database may have planned these.
        schedule = store.load_schedule(session, policy.run_id)
        candidates = store.unplanned(session, policy.run_id)
        now = self._clock()
        created = 0
        for candidate in candidates:
            if policy.is_base(candidate):
                created += self._make_due(session, policy, schedule, candidate, "eval_before_train", now)
                continue
            created += self._isolated(session, policy, schedule, candidate, now)
        store.save_schedule(session, schedule, now)
        return created

    def _isolated(
        self,
        session: Session,
        policy: RunPolicy,
        schedule: store.Schedule,
        candidate: store.PlanCandidate,
        now: datetime,
    ) -> int:
        """:meth:`_decide` in a savepoint: a checkpoint the database refuses to plan (a job it will not
        take) is skipped with the database's words, and the run's other checkpoints are planned."""
        before = dataclasses.replace(schedule)
        try:
            with session.begin_nested():
                return self._decide(session, policy, schedule, candidate, now)
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            for item in dataclasses.fields(schedule):
                setattr(schedule, item.name, getattr(before, item.name))
            why = f"not planned: {type(exc).__name__}: {reason(exc)}"
            store.set_plan(session, candidate.id, Plan.SKIPPED, why, now)
            log.error("checkpoint.plan_failed", run=policy.name, step=candidate.step, error=why)
            return 0

    def _decide(
        self,
        session: Session,
        policy: RunPolicy,
        schedule: store.Schedule,
        candidate: store.PlanCandidate,
        now: datetime,
    ) -> int:
        epoch = frequency.epoch_of(candidate.step, candidate.epoch, policy.config.steps_per_epoch)
        step = candidate.step
        if step is not None and step < schedule.anchor_step and not policy.is_final(step):
            return self._late(session, policy, schedule, candidate, step, epoch, now)
        if candidate.step is not None:
            # The time trigger only ever takes the newest checkpoint: older waiting ones are done for.
            reason = f"not due: superseded by step {candidate.step} (the time trigger takes the newest)"
            older = [
                w
                for w in store.waiting(session, policy.run_id)
                if w.step is not None and w.step < candidate.step
            ]
            self._skip(session, policy, older, reason, now)
        if policy.is_final(candidate.step):
            final = f"final step (final_step={policy.config.final_step})"
            return self._make_due(session, policy, schedule, candidate, final, now, final=final)
        decision = frequency.decide(
            policy.effective(schedule), anchor(schedule), step=candidate.step, epoch=epoch, now=now
        )
        if decision.verdict is frequency.Verdict.DUE:
            return self._make_due(session, policy, schedule, candidate, decision.reason, now)
        waiting = decision.verdict is frequency.Verdict.WAITING
        store.set_plan(session, candidate.id, Plan.WAITING if waiting else Plan.SKIPPED, decision.reason, now)
        event = "checkpoint.waiting" if waiting else "checkpoint.skipped"
        log.info(event, run=policy.name, step=candidate.step, reason=decision.reason)
        return 0

    def _late(
        self,
        session: Session,
        policy: RunPolicy,
        schedule: store.Schedule,
        candidate: store.PlanCandidate,
        step: int,
        epoch: int | None,
        now: datetime,
    ) -> int:
        """A checkpoint that became ready after a newer one was planned (it was incomplete, or copied in
        late): judged by its step and epoch against the evaluated checkpoint before it, as it would have
        been in step order. The time trigger takes only the newest, so it plays no part here."""
        refusal = late_refusal(policy, schedule)
        if refusal is not None:
            self._skip(session, policy, [candidate], refusal, now)
            return 0
        before = store.due_before(session, policy.run_id, step)
        due, why = judge_late(policy, schedule, step=step, epoch=epoch, before=before, now=now)
        if due:
            return self._make_due(session, policy, schedule, candidate, why, now)
        self._skip(session, policy, [candidate], why, now)
        return 0

    def _skip(
        self,
        session: Session,
        policy: RunPolicy,
        candidates: Sequence[store.PlanCandidate],
        reason: str,
        now: datetime,
    ) -> None:
        for candidate in candidates:
            store.set_plan(session, candidate.id, Plan.SKIPPED, reason, now)
            log.info("checkpoint.skipped", run=policy.name, step=candidate.step, reason=reason)

    def _make_due(
        self,
        session: Session,
        policy: RunPolicy,
        schedule: store.Schedule,
        candidate: store.PlanCandidate,
        reason: str,
        now: datetime,
        *,
        final: str | None = None,
    ) -> int:
        # Any evaluation resets every trigger (AReaL reset only the one that fired).
        schedule.evaluated += 1
        if candidate.step is not None:
            schedule.anchor_step = max(schedule.anchor_step, candidate.step)
        epoch = frequency.epoch_of(candidate.step, candidate.epoch, policy.config.steps_per_epoch)
        if epoch is not None:
            schedule.anchor_epoch = max(schedule.anchor_epoch, epoch)
        schedule.anchor_at = now
        store.set_plan(session, candidate.id, Plan.DUE, reason, now)
        if final is None and policy.is_final(candidate.step):
            final = f"final step (final_step={policy.config.final_step})"
        created = enqueue(session, policy, candidate, self._scheduling.two_stage, schedule.evaluated, final)
        log.info(
            "checkpoint.due",
            run=policy.name,
            step=candidate.step,
            reason=reason,
            jobs=created,
            seq=schedule.evaluated,
        )
        if policy.backlog == "newest_only" and candidate.step is not None:
            superseded = store.supersede(
                session,
                policy.run_id,
                below_step=candidate.step,
                reason=f"superseded by step {candidate.step} before it ran (backlog = newest_only)",
                keep_path=str(policy.config.base_model) if policy.config.eval_before_train else None,
            )
            if superseded:
                log.info("job.superseded", run=policy.name, by_step=candidate.step, job_ids=superseded)
        if self._on_reset is not None:
            self._on_reset(policy.name, now)
        return created

    # -- the time trigger ---------------------------------------------------------------------------

    def time_tick(self, run_name: str) -> int:
        """The run's time trigger fired: the newest waiting checkpoint is due if ``freq_secs`` passed."""
        policy = self.policies.get(run_name)
        if policy is None or policy.triggers.secs is None:
            return 0
        with self._db.session() as session:
            schedule = store.load_schedule(session, policy.run_id)
            now = self._clock()
            last = anchor(schedule)
            if not frequency.time_due(policy.triggers, last, now):
                return 0
            waiting = store.waiting(session, policy.run_id)
            if not waiting:
                return 0
            newest = waiting[-1]
            self._skip(
                session,
                policy,
                waiting[:-1],
                f"not due: superseded by step {newest.step} (the time trigger takes the newest)",
                now,
            )
            elapsed = (now - last.at).total_seconds()
            reason = (
                f"time trigger: {elapsed:.0f} s since the last evaluation, freq_secs={policy.triggers.secs:g}"
            )
            created = self._make_due(session, policy, schedule, newest, reason, now)
            store.save_schedule(session, schedule, now)
        return created

    # -- after a result -----------------------------------------------------------------------------

    def after_result(
        self, session: Session, job: queries.ClaimedJob, metrics: Sequence[queries.MetricRow]
    ) -> int:
        """Follow-ups of a stored result, in its transaction: the full stage when a quick result is a new
        best or an anomaly candidate, and the adaptive interval (:mod:`daemon.scheduling.followups`).
        Returns how many jobs were created; a failure there is logged and undone, and the result itself
        still commits."""
        policy = self.policies.get(job.run)
        if policy is None:
            return 0
        return followups.after_result(session, policy, self._scheduling, job, metrics, self._clock)

    # -- housekeeping -------------------------------------------------------------------------------

    def finalize_quiet_runs(self) -> int:
        """A run whose newest checkpoint has had no successor for ``final_after_secs`` has finished:
        that checkpoint is evaluated (even if its frequency skipped it), with its full stage."""
        created = 0
        now = self._clock()
        for policy in self.policies.values():
            with self._db.session() as session:
                # A newer checkpoint still being written is the newest: the run is not quiet.
                newest = store.newest_checkpoint(session, policy.run_id)
                if newest is None or newest.planned_at is None:
                    continue
                limit = quiet_limit(
                    self._scheduling.final_after_secs, store.recent_plan_times(session, policy.run_id)
                )
                if now - newest.planned_at < limit:
                    continue
                schedule = store.load_schedule(session, policy.run_id)
                quiet = f"final: no newer checkpoint for {limit.total_seconds():.0f} s"
                if newest.plan is not Plan.DUE:
                    created += self._make_due(session, policy, schedule, newest, quiet, now, final=quiet)
                    store.save_schedule(session, schedule, now)
                else:
                    for task in policy.watched.tasks:
                        if task in self._scheduling.two_stage:
                            created += enqueue_full(session, policy, newest.id, newest.step, task, quiet)
        return created
