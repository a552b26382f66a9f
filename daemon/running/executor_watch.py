"""Whether the executor can take jobs: made from ``[executor]``, checked, and watched while it is away.

An executor found unusable as configured (no such partition, a job folder not writable, a job ``sbatch``
refused for a setting: a feature, GRES, account or QoS the cluster does not have) is logged once with
what is wrong (``executor.unusable``) and checked again every :data:`EXECUTOR_RECHECK_SECS` (a refused
job by ``sbatch --test-only`` of its script) and at every reload; one whose
controller does not answer pauses claiming with one ``executor.unreachable`` line (polling goes on) and
``executor.reachable`` says when it is back. With ``probe_job_dir`` a first job checks that the compute
nodes see ``job_dir``. The local executor has nothing to watch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import structlog

from daemon.config import Config
from daemon.running import remote
from daemon.running.executors.base import (
    Executor,
    ExecutorError,
    ExecutorMisconfigured,
    ExecutorUnavailable,
    Handle,
)
from daemon.running.executors.local import LocalExecutor
from daemon.running.executors.slurm import SlurmExecutor

log = structlog.get_logger("evald.runner")

#: How often an executor found unusable (no such partition, a job folder not writable) is checked again.
EXECUTOR_RECHECK_SECS = 60.0


class ExecutorWatch:
    """The executor new claims go to, and whether it takes them (see the module's docstring)."""

    def __init__(self, config: Config, jobs: Callable[[], int]) -> None:
        #: How many jobs the runner holds (``executor.reachable`` says).
        self._jobs = jobs
        self._config = config
        self.executor: Executor = self._local(config)
        #: Why the executor cannot take jobs (no such partition, ...), and when that is checked again.
        self._unusable: str | None = None
        self._recheck_at = 0.0
        #: Since when (monotonic) the executor's controller does not answer; None while it does.
        self.unreachable_since: float | None = None
        #: When a controller away is asked next while no job is due to be polled (monotonic).
        self.next_probe = 0.0
        #: The job checking that the compute nodes see ``job_dir`` (``probe_job_dir``), until it answers.
        self._folder_probe: Handle | None = None
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
            self._set(config, probe=False)

    def _set(self, config: Config, *, probe: bool = True) -> None:
        """Make the executor ``[executor]`` asks for and check it; with ``probe``, and
        ``probe_job_dir``, submit the job folder probe."""
        try:
            made: SlurmExecutor | None = remote.make_executor(config)
        except ExecutorError as exc:
            # No claim is made while it is unusable; what runs here meanwhile are the local rules.
            self.executor = self._local(config)
            self._unusable = str(exc)
            log.error("executor.unusable", error=self._unusable, action="no job is claimed until it is fixed")
            return
        if probe:
            self._folder_probe = None  # a new probe is submitted below (an earlier one's answer is moot)
        if made is None:
            self.executor = self._local(config)
            self._unusable = None
            return
        self.executor = made
        if self.check() and probe and config.executor.probe_job_dir:
            self._probe_job_dir(made)

    @property
    def unusable(self) -> str | None:
        """Why the executor takes no job now (None: it does, or jobs run here)."""
        if self._unusable is not None:
            return self._unusable
        if self.unreachable_since is not None:
            return "the Slurm controller does not answer"
        return None

    def check(self) -> bool:
        """Whether the executor can take jobs (partition there, job folder writable); an unusable one is
        logged once with what is wrong and checked again every :data:`EXECUTOR_RECHECK_SECS`."""
        self._recheck_at = time.monotonic() + EXECUTOR_RECHECK_SECS
        try:
            self.executor.check()
        except ExecutorUnavailable as exc:
            self.away(str(exc))
            return False
        except ExecutorError as exc:
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
            self.unreachable_since = time.monotonic()
            log.warning(
                "executor.unreachable",
                error=error,
                action="claiming paused; queued and running jobs are polled until it answers",
            )

    def back(self) -> None:
        if self.unreachable_since is not None:
            down = time.monotonic() - self.unreachable_since
            self.unreachable_since = None
            log.info("executor.reachable", down_secs=round(down, 1), jobs=self._jobs())

    def tick(self, now: float, *, jobs_due: bool) -> bool:
        """The watch's share of a poll: an unusable executor checked again when due, the folder probe
        read, a controller away asked whether it is back when no job is due to ask it; False when the
        jobs are not to be polled this time."""
        if not self.detached:
            return True
        if self._unusable is not None and now >= self._recheck_at:
            self.check()
        poll_secs = self._config.executor.poll_secs
        if self._folder_probe is not None and self.unreachable_since is None and now >= self.next_probe:
            self.next_probe = now + poll_secs
            self._read_folder_probe()
        if not jobs_due and self.unreachable_since is not None:
            # No job to ask about: the controller is asked whether it is back every poll_secs all the same.
            if now >= self.next_probe:
                self.check()
                self.next_probe = time.monotonic() + poll_secs
            return False
        return True

    def _probe_job_dir(self, executor: SlurmExecutor) -> None:
        try:
            self._folder_probe = executor.probe_job_dir()
        except ExecutorMisconfigured as exc:
            # Refused as any job would be (its options are the config's): nothing is claimed for it.
            self.refused(str(exc))
        except (ExecutorError, ExecutorUnavailable, OSError) as exc:
            # Not a verdict on the folder: the jobs themselves will tell.
            log.warning("executor.job_dir_unchecked", job_dir=str(executor.job_dir), error=str(exc))

    def _read_folder_probe(self) -> None:
        """The folder probe's answer, once its job ended: shared (one line), or not (unusable)."""
        executor = self.executor
        assert isinstance(executor, SlurmExecutor) and self._folder_probe is not None
        try:
            seen = executor.probe_result(self._folder_probe)
        except ExecutorUnavailable:
            return
        except ExecutorError as exc:
            self._folder_probe = None
            self._unusable = str(exc)
            self._recheck_at = float("inf")  # only a reload with another job_dir clears it
            log.error("executor.unusable", error=str(exc), action="no job is submitted until it is fixed")
            return
        if seen:
            log.info("executor.job_dir_shared", job_dir=str(executor.job_dir))
            self._folder_probe = None
