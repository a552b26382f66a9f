"""The queue side of running jobs: whether to claim (capacity, resources, room), which job, and its spec.

Claiming pauses while the state folder is full (longer each time in a row, up to a minute), while the
executor cannot take jobs, and while the node's resource thresholds are unmet: then every waiting job is
deferred with the reason (jobs through Slurm use the cluster's resources: no threshold applies), and
released by the deferral re-check once they are met; one deferred past ``stuck_after_secs`` is reported.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Collection
from datetime import timedelta
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.alerts.lifecycle import Alerter
from daemon.config import Config
from daemon.errors import JobSetupError
from daemon.scheduling import stages
from daemon.scheduling.planner import Planner
from daemon.scheduling.resources import ResourceProbe
from inference.spec import JobSpec
from storage import queries
from storage import scheduling as store
from storage.database import Database
from storage.models import JobState, utcnow

log = structlog.get_logger("evald.runner")

#: A state folder out of space or quota: the job waits for room instead of failing.
SCRATCH_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
SCRATCH_PAUSE_MAX_SECS = 60.0


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
    # An s3:// run's checkpoint is recorded under the run's mirror: its spec takes the downloaded copy's
    # path once there is one (daemon.running.fetches).
    checkpoint = Path(job.checkpoint_path)
    return JobSpec(
        job_id=job.id,
        checkpoint_path=checkpoint,
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


class JobQueue:
    """Claims jobs for one runner (see the module's docstring)."""

    def __init__(
        self,
        config: Config,
        database: Database,
        owner: str,
        *,
        planner: Planner | None,
        probe: ResourceProbe | None,
        alerter: Alerter | None,
    ) -> None:
        self._db = database
        self._owner = owner
        self.reconfigure(config, planner=planner, probe=probe, alerter=alerter)
        #: The state folder was full (ENOSPC): no claim before this moment; how many times in a row.
        self.paused_until = 0.0
        self.scratch_failures = 0
        #: The pending jobs say ``max_queued`` is reached (:meth:`say_full`), until the next claim.
        self._full_said = False

    def reconfigure(
        self,
        config: Config,
        *,
        planner: Planner | None,
        probe: ResourceProbe | None,
        alerter: Alerter | None,
    ) -> None:
        self._config = config
        #: Knows the configured runs and which of them take their oldest checkpoint first.
        self._planner = planner
        #: The resource thresholds; None when none is set.
        self._probe = probe
        self._alerter = alerter
        self._deferred_reason: str | None = None

    @property
    def run_ids(self) -> frozenset[int] | None:
        # The planner knows the configured runs' ids; without one (tests, `evald eval`) any run's jobs.
        if self._planner is None:
            return None
        return frozenset(p.run_id for p in self._planner.policies.values())

    def waiting(self, *states: JobState) -> bool:
        with self._db.session() as session:
            return store.count_jobs(session, *states) > 0

    def resources_met(self, *, busy: bool, detached: bool) -> bool:
        """Check the thresholds; when unmet, defer every waiting job with the reason and return False.
        ``detached``: jobs go to the cluster's resources, not this node's. ``busy``: our own evaluations
        hold the resources, and the rest wait for a slot, queued rather than deferred (and never reported
        stuck because of us)."""
        if self._probe is None or detached:
            return True
        check = self._probe.check()
        if check.met:
            if self._deferred_reason is not None:
                log.info("resources.met", previously=self._deferred_reason)
                self._deferred_reason = None
            return True
        if busy:
            return False
        with self._db.session() as session:
            newly = store.defer_pending(session, check.reason, utcnow())
        if newly or check.reason != self._deferred_reason:
            log.warning("job.deferred", jobs=newly, reason=check.reason)
        self._deferred_reason = check.reason
        return False

    def release_deferred(self) -> int:
        with self._db.session() as session:
            released = store.release_deferred(session)
        if released:
            log.info("job.released", jobs=released)
        return released

    def report_stuck(self) -> int:
        """A ``stuck`` event (and alert) for each job deferred past ``stuck_after_secs``."""
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

    def claim(
        self, own_per_run: Collection[int], *, detached: bool, resting: frozenset[int] = frozenset()
    ) -> queries.ClaimedJob | None:
        """Claim the most urgent job this daemon may take; ``own_per_run``: the run ids of the jobs it
        holds (one entry a job), counted against the executor's limits when ``detached``; ``resting``:
        runs not to claim from now (their store just failed a download)."""
        oldest_first = self._planner.oldest_first if self._planner is not None else frozenset()
        with self._db.session() as session:
            full = self._full_runs(session, list(own_per_run)) if detached else frozenset()
            if detached:
                self._say_held(session, full)
                self._full_said = full is None
            if full is None:
                return None
            return queries.claim_next_job(
                session,
                self._owner,
                oldest_first=oldest_first,
                runs=self.run_ids,
                tasks=frozenset(t.name for t in self._config.tasks),
                exclude_runs=full | resting,
                newest_first=detached and self._config.executor.priority == "newest",
            )

    def say_full(self) -> None:
        """This daemon holds ``max_queued`` jobs in the scheduler: the pending ones say so (once, until
        the next claim)."""
        if self._full_said:
            return
        with self._db.session() as session:
            self._say_held(session, None)
        self._full_said = True

    def _say_held(self, session: Session, full: frozenset[int] | None) -> None:
        """Record on the pending jobs why the executor's queue limits hold them back (``evald status``
        shows it); a claim clears it."""
        limits = self._config.executor
        if full is None:
            store.hold_pending(session, {}, f"{store.HELD_PREFIX}max_queued {limits.max_queued} reached")
            return
        names = store.run_names(session, full)
        store.hold_pending(
            session,
            {
                run_id: f"{store.HELD_PREFIX}max_queued_per_run {limits.max_queued_per_run} reached for "
                f"run {names.get(run_id, run_id)!r}"
                for run_id in full
            },
        )

    def _full_runs(self, session: Session, own_runs: list[int]) -> frozenset[int] | None:
        """Runs at ``max_queued_per_run`` jobs queued or running in Slurm; None when all are at
        ``max_queued`` (counted in the database, so daemons sharing it share the limit, and among this
        daemon's own jobs, whose submission may not be stored yet)."""
        limits = self._config.executor
        stored = queries.submitted_per_run(session)
        own: dict[int, int] = {}
        for run_id in own_runs:
            own[run_id] = own.get(run_id, 0) + 1
        per_run = {run: max(stored.get(run, 0), own.get(run, 0)) for run in {*stored, *own}}
        if max(sum(stored.values()), len(own_runs)) >= limits.max_queued:
            return None
        if limits.max_queued_per_run is None:
            return frozenset()
        return frozenset(run for run, n in per_run.items() if n >= limits.max_queued_per_run)

    # --- room in the state folder ---------------------------------------------------------------------

    @property
    def out_of_room(self) -> bool:
        return self.paused_until > time.monotonic()

    def pause_for_room(self) -> float:
        """A job found no room for its files: claiming pauses, longer each time in a row; the pause."""
        self.scratch_failures += 1
        pause = min(SCRATCH_PAUSE_MAX_SECS, 2.0 ** (self.scratch_failures - 1))
        self.paused_until = time.monotonic() + pause
        return pause

    def room_again(self, state_dir: Path) -> None:
        """A job's files were written: any earlier shortage is over."""
        if self.scratch_failures:
            log.info("scratch.writable", state_dir=str(state_dir), after=self.scratch_failures)
            self.scratch_failures = 0
