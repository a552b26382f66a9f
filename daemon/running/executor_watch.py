"""Whether the executor can take jobs: made from ``[executor]``, checked, and watched while it is away.

An executor found unusable as configured (no such partition, a job folder not writable, a job ``sbatch``
refused for a setting: a feature, GRES, account or QoS the cluster does not have) is logged once with
what is wrong (``executor.unusable``) and checked again every :data:`EXECUTOR_RECHECK_SECS` (a refused
job by ``sbatch --test-only`` of its script) and at every reload; one whose
controller does not answer pauses claiming with one ``executor.unreachable`` line (polling goes on) and
``executor.reachable`` says when it is back (``down_secs`` from its last answer before). With
``probe_job_dir`` a first job checks that the compute nodes see ``job_dir``, and each s3 run's ``[runs.s3]
cache_dir`` (its workers load the copies downloaded there): again at a reload that adds such a folder. The
local executor has nothing to watch.

The checks and the probe run on the watch's :class:`~daemon.running.executors.calls.Calls` threads (the
dispatcher's Slurm calls too), their answers applied by the loop's next pass: a controller that does not
answer holds no pass. Until a new executor's first check has answered, nothing is claimed for it.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import structlog

from daemon.config import Config
from daemon.running import remote
from daemon.running.executors import folder_probe
from daemon.running.executors.base import (
    Executor,
    ExecutorError,
    ExecutorMisconfigured,
    ExecutorUnavailable,
    Handle,
    SharedFolder,
)
from daemon.running.executors.calls import Apply, Calls
from daemon.running.executors.local import LocalExecutor
from daemon.running.executors.ray import RayExecutor, make_ray_executor
from daemon.running.executors.slurm import SlurmExecutor
from daemon.running.outages import Outage
from storage.models import utcnow

log = structlog.get_logger("evald.runner")

#: How often ended jobs' folders past their retention are looked for (more often for a short retention).
TIDY_SECS = 600.0
MIN_TIDY_SECS = 5.0

#: How often an executor found unusable (no such partition, a job folder not writable) is checked again.
EXECUTOR_RECHECK_SECS = 60.0


class ExecutorWatch:
    """The executor new claims go to, and whether it takes them (see the module's docstring)."""

    def __init__(self, config: Config, jobs: Callable[[], int]) -> None:
        #: How many jobs the runner holds (``executor.reachable`` says).
        self._jobs = jobs
        self._config = config
        #: The threads the executor's tools run on (the dispatcher's calls too).
        self.calls = Calls()
        #: A new executor whose first check has not answered yet: no claim for it meanwhile.
        self._checking: Executor | None = None
        self.executor: Executor = self._local(config)
        #: Why the executor cannot take jobs (no such partition, ...), and when that is checked again.
        self._unusable: str | None = None
        self._recheck_at = 0.0
        #: Since when (monotonic) the executor's controller does not answer: its last answer before the
        #: question it left unanswered (the outage began after it); None while it answers.
        self.unreachable_since: float | None = None
        #: When the controller last answered (monotonic); None before it ever did.
        self.answered_at: float | None = None
        #: The outage under way (its start as a wall-clock time, for ``evald status``); None while the
        #: controller answers.
        self.outage: Outage | None = None
        #: Outages begun or ended since the database was last told (:meth:`take_news`); the daemon's first
        #: answer is news too (it ends what an earlier daemon may have left recorded as an outage).
        self._news: list[Outage] = []
        #: When a controller away is asked next while no job is due to be polled (monotonic).
        self.next_probe = 0.0
        #: The job checking that the compute nodes see ``job_dir`` (``probe_job_dir``), until it answers,
        #: and the other folders it checks.
        self._folder_probe: Handle | None = None
        self._probed: list[SharedFolder] = []
        #: The latest probe submitted: one submitted before it (a reload's) is dropped when it lands.
        self._probe_seq = 0
        #: When ``job_dir`` is cleaned up next (monotonic).
        self._tidy_at = 0.0
        self._set(config)

    @staticmethod
    def _local(config: Config) -> LocalExecutor:
        return LocalExecutor(config, python=str(config.inference.python or sys.executable))

    @property
    def detached(self) -> bool:
        """New jobs go to a scheduler (Slurm), not to worker processes here."""
        return self.executor.detached

    def reconfigure(self, config: Config) -> None:
        """Take a reloaded config: a new executor where ``[executor]`` or ``[inference]`` (what a batch
        script is made of) changed, or while it is unusable (the fix may be the cluster's: it is checked
        again); jobs already handed to the old one stay with it. The local executor starts workers with
        the new settings."""
        old = self._config
        self._config = config
        if config.executor != old.executor or self._unusable is not None:
            self._set(config)
        elif isinstance(self.executor, LocalExecutor):
            self.executor = self._local(config)
        elif config.inference != old.inference:
            self._set(config, probe=_new_folders(config, old))
        elif _new_folders(config, old) and config.executor.probe_job_dir:
            executor = self.executor
            if isinstance(executor, SlurmExecutor | RayExecutor):
                # A folder the nodes may not see yet (a new s3 run's cache_dir): probed, job_dir again.
                self._drop_probe(executor)
                self._probe_job_dir(executor)

    def _set(self, config: Config, *, probe: bool = True) -> None:
        """Make the executor ``[executor]`` asks for and check it; with ``probe``, and
        ``probe_job_dir``, submit the job folder probe."""
        try:
            made: SlurmExecutor | RayExecutor | None = (
                make_ray_executor(config) if config.executor.kind == "ray" else remote.make_executor(config)
            )
        except ExecutorError as exc:
            # No claim is made while it is unusable; what runs here meanwhile are the local rules.
            self.executor = self._local(config)
            self._unusable = str(exc)
            log.error("executor.unusable", error=self._unusable, action="no job is claimed until it is fixed")
            return
        if probe:
            # A new probe is submitted below (an earlier one's answer is moot).
            self._drop_probe(self.executor)
        if made is None:
            self.executor = self._local(config)
            self._unusable = None
            return
        self.executor = made
        self._checking = made
        self._check_soon(probe=probe and config.executor.probe_job_dir)

    @property
    def unusable(self) -> str | None:
        """Why the executor takes no job now (None: it does, or jobs run here)."""
        if self._unusable is not None:
            return self._unusable
        if self._checking is not None:
            return "the executor is being checked"
        if self.unreachable_since is not None:
            return f"{self.away_what} does not answer"
        return None

    @property
    def away_what(self) -> str:
        """What answers for the executor: ``the Ray head at <address>``, ``the Slurm controller``."""
        if isinstance(self.executor, RayExecutor):
            return f"the Ray head at {self._config.executor.ray.address}"
        return "the Slurm controller"

    def take_news(self) -> list[Outage]:
        """The outages begun or ended that the database does not know of yet; the caller stores them."""
        news, self._news = self._news, []
        return news

    def give_back_news(self, news: list[Outage]) -> None:
        """Outages the database could not take (it was away): told again at the next pass."""
        self._news[:0] = news

    def check(self) -> bool:
        """Whether the executor can take jobs (partition there, job folder writable); an unusable one is
        logged once with what is wrong and checked again every :data:`EXECUTOR_RECHECK_SECS`."""
        self._recheck_at = time.monotonic() + EXECUTOR_RECHECK_SECS
        return self._checked(self.executor, _asked(self.executor))

    def _check_soon(self, *, probe: bool = False) -> None:
        """:meth:`check` on a thread, its answer applied by a later pass; with ``probe``, once the check
        passes, the job folder probe is submitted."""
        executor = self.executor

        def work() -> Apply:
            error = _asked(executor)
            return lambda: self._answered(executor, error, probe)

        if self.calls.start(("check", id(executor)), work):
            self._recheck_at = time.monotonic() + EXECUTOR_RECHECK_SECS

    def _answered(self, executor: Executor, error: Exception | None, probe: bool) -> None:
        if executor is not self.executor:
            return  # a reload replaced it meanwhile
        if self._checked(executor, error) and probe and isinstance(executor, SlurmExecutor | RayExecutor):
            self._probe_job_dir(executor)

    def _checked(self, executor: Executor, error: Exception | None) -> bool:
        """What a check's answer (``error``: None when it passed) means for claiming."""
        if self._checking is executor:
            self._checking = None
        if isinstance(error, ExecutorUnavailable):
            self.away(str(error))
            return False
        if error is not None:
            exc = error
            self.back()
            if str(exc) != self._unusable:
                log.error(
                    "executor.unusable",
                    error=str(exc),
                    action="jobs stay queued until it is fixed (edit the config and reload)",
                )
            self._unusable = str(exc)
            return False
        self.back()
        if self._unusable is not None:
            log.info("executor.usable", previously=self._unusable)
        self._unusable = None
        return True

    def refused(self, error: str) -> None:
        """The scheduler refused a job for the config's sake: claiming pauses, with one line, until a
        check finds the refused job would be taken (every :data:`EXECUTOR_RECHECK_SECS`, and at a
        reload)."""
        self._recheck_at = time.monotonic() + EXECUTOR_RECHECK_SECS
        if error != self._unusable:
            log.error(
                "executor.unusable",
                error=error,
                action="jobs stay queued until it is fixed (edit the config and reload)",
            )
        self._unusable = error

    def away(self, error: str) -> None:
        """The executor's controller did not answer: one line, claiming pauses, polling goes on."""
        if self.unreachable_since is None:
            now = time.monotonic()
            self.unreachable_since = now if self.answered_at is None else self.answered_at
            since = utcnow() - timedelta(seconds=now - self.unreachable_since)
            self.outage = Outage(False, since, self.away_what, self.executor.kind, error)
            self._news.append(self.outage)
            log.warning(
                "executor.unreachable",
                error=error,
                unanswered_secs=round(now - self.unreachable_since, 1),
                action="claiming paused; queued and running jobs are polled until it answers",
            )

    def back(self) -> None:
        """The controller answered: an outage ends, ``down_secs`` counted from its last answer before."""
        first = self.answered_at is None
        self.answered_at = time.monotonic()
        if first or self.outage is not None:
            began = self.outage.since if self.outage is not None else utcnow()
            self._news.append(Outage(True, began, self.away_what, self.executor.kind, at=utcnow()))
            self.outage = None
        if self.unreachable_since is not None:
            down = self.answered_at - self.unreachable_since
            self.unreachable_since = None
            log.info("executor.reachable", down_secs=round(down, 1), jobs=self._jobs())

    def tick(self, now: float, *, jobs_due: bool) -> bool:
        """The watch's share of a poll: an unusable executor checked again when due, the folder probe
        read, a controller away asked whether it is back when no job is due to ask it; False when the
        jobs are not to be polled this time."""
        if not self.detached:
            return True
        if self._unusable is not None and now >= self._recheck_at:
            self._check_soon()
        poll_secs = self._config.executor.poll_secs
        if self._folder_probe is not None and self.unreachable_since is None and now >= self.next_probe:
            self.next_probe = now + poll_secs
            self._read_folder_probe()
        if not jobs_due and self.unreachable_since is not None:
            # No job to ask about: the controller is asked whether it is back every poll_secs all the same.
            if now >= self.next_probe:
                self._check_soon()
                self.next_probe = time.monotonic() + poll_secs
            return False
        return True

    def _probe_job_dir(self, executor: SlurmExecutor | RayExecutor) -> None:
        """Submit the job folder probe, of ``job_dir`` and the config's :func:`shared_folders` (on a
        thread; its handle kept by a later pass)."""
        also = shared_folders(self._config)
        self._probe_seq += 1
        seq = self._probe_seq

        def work() -> Apply:
            try:
                probe = executor.probe_job_dir(also)
            except (ExecutorError, ExecutorUnavailable, OSError) as exc:
                return functools.partial(self._probe_refused, executor, exc)
            return lambda: self._probe_submitted(executor, probe, also, seq)

        self.calls.start(("probe", "submit", seq), work)

    def _probe_submitted(self, executor: Executor, probe: Handle, also: list[SharedFolder], seq: int) -> None:
        if executor is self.executor and seq == self._probe_seq:
            self._folder_probe = probe
            self._probed = also
        else:
            self.calls.start(("cancel", probe.external_id), lambda: _probe_dropped(executor, probe))

    def _drop_probe(self, executor: Executor) -> None:
        """Forget the probe under way (a new one is submitted): its job is cancelled, the tokens it
        placed in other folders removed (on a thread)."""
        probe, self._folder_probe = self._folder_probe, None
        if probe is not None:
            self.calls.start(("cancel", probe.external_id), lambda: _probe_dropped(executor, probe))

    def _probe_refused(self, executor: SlurmExecutor | RayExecutor, exc: Exception) -> None:
        if executor is not self.executor:
            return
        if isinstance(exc, ExecutorMisconfigured):
            # Refused as any job would be (its options are the config's): nothing is claimed for it.
            self.refused(str(exc))
        else:
            # Not a verdict on the folder: the jobs themselves will tell.
            log.warning("executor.job_dir_unchecked", job_dir=str(executor.job_dir), error=str(exc))

    def _read_folder_probe(self) -> None:
        """Ask for the folder probe's answer (on a thread; applied by a later pass)."""
        executor, probe = self.executor, self._folder_probe
        assert isinstance(executor, SlurmExecutor | RayExecutor) and probe is not None

        def work() -> Apply:
            try:
                seen = executor.probe_result(probe)
            except (ExecutorError, ExecutorUnavailable) as exc:
                return functools.partial(self._folder_probe_said, probe, None, exc)
            return lambda: self._folder_probe_said(probe, seen, None)

        self.calls.start(("probe", id(executor)), work)

    def _folder_probe_said(self, probe: Handle, seen: bool | None, error: Exception | None) -> None:
        """The folder probe's answer, once its job ended: shared (one line), or not (unusable)."""
        executor = self.executor
        if probe is not self._folder_probe or not isinstance(executor, SlurmExecutor | RayExecutor):
            return
        if isinstance(error, ExecutorUnavailable):
            return
        if error is not None:
            exc = error
            self._folder_probe = None
            self._unusable = str(exc)
            self._recheck_at = float("inf")  # only a reload with another job_dir clears it
            log.error("executor.unusable", error=str(exc), action="no job is submitted until it is fixed")
            return
        if seen:
            also = {"also": [str(f.path) for f in self._probed]} if self._probed else {}
            log.info("executor.job_dir_shared", job_dir=str(executor.job_dir), **also)
            self._folder_probe = None
        elif seen is False:
            # Cancelled before it could tell (by someone, or by a daemon taking it for a dead one's).
            log.warning("executor.job_dir_unchecked", job_dir=str(executor.job_dir), error="probe cancelled")
            self._folder_probe = None

    def tidy_due(self) -> bool:
        """Whether ``job_dir`` is to be cleaned up now (a Slurm or Ray executor's, every :data:`TIDY_SECS`
        or half the shorter retention)."""
        return isinstance(self.executor, SlurmExecutor | RayExecutor) and time.monotonic() >= self._tidy_at

    def tidy(self, busy: set[int]) -> None:
        """Clean ``job_dir`` up on a thread (see :mod:`.executors.job_dirs`); ``busy``: the ids of the
        jobs running anywhere, whose folders stay."""
        executor = self.executor
        if not isinstance(executor, SlurmExecutor | RayExecutor):
            return
        settings = executor.config
        shortest = min(settings.keep_job_dirs_secs, settings.keep_failed_job_dirs_secs)
        self._tidy_at = time.monotonic() + min(TIDY_SECS, max(MIN_TIDY_SECS, shortest / 2))
        keep = [self._folder_probe.job_dir] if self._folder_probe is not None else []

        def work() -> Apply:
            executor.tidy(busy, keep)
            return lambda: None

        self.calls.start(("tidy", id(executor)), work)


def shared_folders(config: Config) -> list[SharedFolder]:
    """The folders besides ``job_dir`` a detached executor's nodes must see: each s3 run's ``[runs.s3]
    cache_dir`` (its workers load the copies downloaded there), once each, naming the runs."""
    runs: dict[Path, list[str]] = {}
    for run in config.runs:
        if run.url is not None and run.s3 is not None:
            runs.setdefault(run.s3.cache_dir, []).append(run.name)
    return [
        SharedFolder(
            path,
            f"[runs.s3] cache_dir {path} of run{'s' if len(names) > 1 else ''} "
            + ", ".join(f"'{name}'" for name in names),
        )
        for path, names in runs.items()
    ]


def _new_folders(config: Config, old: Config) -> bool:
    """Whether ``config`` has a folder for the nodes to see that ``old`` did not."""
    return bool({f.path for f in shared_folders(config)} - {f.path for f in shared_folders(old)})


def _asked(executor: Executor) -> Exception | None:
    """The executor's :meth:`~Executor.check` (on a thread): None when it passed, else what it raised."""
    try:
        executor.check()
    except (ExecutorError, ExecutorUnavailable) as exc:
        return exc
    return None


def _probe_dropped(executor: Executor, probe: Handle) -> Apply:
    """Cancel a folder probe nobody reads any more, and remove the tokens it placed (on a thread)."""
    folder_probe.remove(probe.job_dir)
    return _cancelled(executor, probe)


def _cancelled(executor: Executor, handle: Handle) -> Apply:
    """Cancel a submission nobody follows any more (on a thread)."""
    try:
        executor.cancel(handle)
    except ExecutorUnavailable as exc:
        error = str(exc)
        return lambda: not_cancelled(handle, error)
    return lambda: None


def not_cancelled(handle: Handle, error: str) -> None:
    """A submission nobody follows any more could not be cancelled (its controller away): said under its
    executor's name and key (``slurm.not_cancelled`` with ``slurm_job_id``, ``ray.not_cancelled`` with
    ``ray_job``)."""
    event = "ray.not_cancelled" if handle.executor == "ray" else "slurm.not_cancelled"
    log.warning(event, **handle.logged(), error=error)
