"""The local executor: each job a worker process (or a torchrun / DeepSpeed worker group) on this host.

The job folder is ``<state_dir>/jobs/<job id>-<attempt>`` (``-batch<N>`` for an out-of-memory rerun); the
worker reads ``spec.json`` there and writes its result files and ``worker.log`` beside it. The handle's
``external_id`` is the worker's pid. A worker is tied to the daemon (it stops when the daemon's pid
goes), so nothing it runs outlives the daemon (:attr:`LocalExecutor.detached` is False): a daemon that
restarts finds a worker's result in its folder (:meth:`LocalExecutor.poll` of a handle it did not start)
or nothing. The job's timeout is the runner's clock, which cancels the worker.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

from daemon.config import Config
from daemon.running.environment import worker_environment
from daemon.running.executors.base import Active, Adjustments, Ended, EndKind, Handle, JobRef, Phase, Status
from daemon.running.workers import WorkerProcess, describe_exit
from inference.launcher import worker_command
from inference.spec import EXIT_OUT_OF_MEMORY, JobResult, JobSpec

LOG_NAME = "worker.log"


class LocalExecutor:
    """Starts job folders as worker processes of the daemon's (see the module's docstring)."""

    kind = "local"
    detached = False

    def __init__(self, config: Config, python: str) -> None:
        #: The worker's launcher settings and environment are read from it at each start.
        self._config = config
        self._python = python
        self._workers: dict[str, WorkerProcess] = {}
        #: Workers this executor stopped itself: they end ``cancelled``, whatever their exit status.
        self._cancelled: set[str] = set()

    @property
    def config(self) -> Config:
        return self._config

    def job_folder(self, job: JobRef) -> Path:
        return self._config.daemon.state_dir / "jobs" / f"{job.job_id}-{job.attempt}"

    def check(self) -> None:
        """Nothing to check: the state folder's room shows when a job's files are written."""

    def time_limits(self) -> tuple[int, int] | None:
        """None: the runner's clock times a worker out (``job_timeout_secs``)."""
        return None

    def start(self, spec_path: Path, job: JobRef, adjust: Adjustments | None = None) -> Handle:
        """Start the worker (group) of ``spec_path``; OSError when it cannot be (a full disk, say). No
        adjustment applies here (the timeout is the runner's clock; there are no nodes to choose)."""
        spec = JobSpec.model_validate_json(spec_path.read_bytes())
        folder = spec_path.parent
        command = worker_command(
            spec.inference,
            spec_path,
            python=self._python,
            hostfile=self._config.inference.hostfile,
            launcher_args=self._config.inference.launcher_args,
        )
        worker = WorkerProcess.start(command, folder / LOG_NAME, worker_environment(self._config))
        self._workers[str(worker.pid)] = worker
        return Handle(self.kind, job.job_id, job.attempt, folder, str(worker.pid))

    def poll(self, handle: Handle) -> Status:
        worker = self._workers.get(handle.external_id)
        if worker is None and handle.external_id in self._cancelled:
            return Ended(EndKind.CANCELLED, f"worker {handle.external_id} cancelled by evald")
        if worker is None:
            return _foreign(handle)
        code = worker.poll()
        if code is None:
            return Active(Phase.RUNNING)
        del self._workers[handle.external_id]
        return ended(code)

    def cancel(self, handle: Handle) -> None:
        """Stop the worker and every process under it (SIGTERM, then SIGKILL), and reap them."""
        self._cancelled.add(handle.external_id)
        worker = self._workers.pop(handle.external_id, None)
        if worker is not None:
            worker.kill()
            return
        with contextlib.suppress(psutil.Error, ValueError):
            process = psutil.Process(int(handle.external_id))
            if _runs(process, handle):
                process.kill()

    def find(self, job: JobRef, since: float | None = None) -> Handle | None:
        """The handle of a worker this executor started for ``job`` and still runs; None otherwise (a
        worker does not outlive the daemon that started it)."""
        folder = self.job_folder(job)
        for pid, worker in self._workers.items():
            if worker.log_path.parent == folder and worker.poll() is None:
                return Handle(self.kind, job.job_id, job.attempt, folder, pid)
        return None


def ended(code: int) -> Ended:
    """The end of a worker that exited with ``code``; its files say the rest."""
    if code == 0:
        return Ended(EndKind.SUCCEEDED, "worker exit status 0", exit_code=0)
    kind = EndKind.OUT_OF_MEMORY if code == EXIT_OUT_OF_MEMORY else EndKind.FAILED
    return Ended(kind, f"worker {describe_exit(code)}", exit_code=code)


def _runs(process: psutil.Process, handle: Handle) -> bool:
    """Whether ``process`` is the live worker of ``handle`` (a pid may have been reused since)."""
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return str(handle.job_dir / "spec.json") in " ".join(process.cmdline())
    except psutil.Error:
        return False


def _foreign(handle: Handle) -> Status:
    """A worker some other executor (an earlier daemon) started: running while its process is, then what
    its folder shows."""
    with contextlib.suppress(psutil.Error, ValueError):
        if _runs(psutil.Process(int(handle.external_id)), handle):
            return Active(Phase.RUNNING)
    result: JobResult | None = None
    with contextlib.suppress(OSError, ValueError):
        result = JobResult.read(handle.job_dir / "result.json")
    if result is not None and result.error is None:
        return Ended(EndKind.SUCCEEDED, f"worker {handle.external_id} wrote its result", exit_code=0)
    if result is not None and result.error is not None:
        return Ended(EndKind.FAILED, f"worker {handle.external_id}: {result.error.kind}", exit_code=1)
    return Ended(EndKind.LOST, f"worker {handle.external_id} is gone and left no result")
