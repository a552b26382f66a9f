"""The Slurm executor: each job one ``sbatch`` of a batch script that runs the worker in its job folder.

The job folder (under ``[executor] job_dir``, on a filesystem the compute nodes share) holds what the
local executor's does — ``spec.json`` in; ``result.json``, ``result.rank<N>.json``, ``rank-<N>.log`` out —
plus ``job.sbatch`` (the script as submitted), ``worker.log`` (its output), ``slurm_job_id`` (written by
the daemon after ``sbatch`` and by the script when it starts) and ``exit.json`` (the worker's exit status,
written by the script as it ends). A job of ``tp × dp > 1`` ranks is started with ``srun``, one task a
rank, its rendezvous (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ...) taken from ``SLURM_*``.

Each job is named ``<prefix>-<job id>-<attempt>`` and carries ``<prefix>:job=<id>:attempt=<n>:run=<run>``
as its comment, so that a daemon that died between ``sbatch`` and recording the Slurm job id finds the
submission again (:meth:`SlurmExecutor.find`) instead of submitting it twice.

The scheduler's word on how a job ended is read from ``scontrol show job`` while the controller holds
it (``MinJobAge`` after the end), else from ``sacct`` where accounting answers, else from the folder's
``exit.json`` and result file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

import structlog

from daemon.config import ExecutorConfig
from daemon.running.executors import slurm_script
from daemon.running.executors.base import (
    Active,
    Ended,
    EndKind,
    ExecutorError,
    ExecutorUnavailable,
    Handle,
    JobRef,
    Phase,
    Placement,
    Status,
)
from daemon.running.executors.slurm_cli import SlurmCli
from daemon.running.executors.slurm_output import SlurmError, SlurmJob, SlurmUnreachable, SubmitRejected
from daemon.running.executors.slurm_script import (
    EXIT_NAME,
    ID_NAME,
    LOG_NAME,
    SCRIPT_NAME,
    Layout,
    submission_environment,
)
from daemon.running.workers import stderr_tail
from inference.spec import EXIT_OUT_OF_MEMORY, JobResult, JobSpec

log = structlog.get_logger("evald.executor.slurm")

# srun's word on a rank that failed: "srun: error: node3: task 1: Exited with exit code 3".
_SRUN_TASK = re.compile(r"srun: error: \S+: tasks? (\d+)(?:-\d+)?: (?:Exited with exit code (\d+)|Killed|.*)")

_PENDING_STATES = frozenset({"PENDING", "CONFIGURING", "RESV_DEL_HOLD"})
_RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT"})
_REQUEUED_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})
_HELD_STATES = frozenset({"SUSPENDED", "STOPPED"})
_ENDS = {
    "TIMEOUT": EndKind.TIMEOUT,
    "DEADLINE": EndKind.TIMEOUT,
    "PREEMPTED": EndKind.PREEMPTED,
    "NODE_FAIL": EndKind.NODE_FAIL,
    "BOOT_FAIL": EndKind.NODE_FAIL,
    "OUT_OF_MEMORY": EndKind.OUT_OF_MEMORY,
    "CANCELLED": EndKind.CANCELLED,
}


class SlurmExecutor:
    """Runs job folders as Slurm batch jobs (see the module's docstring)."""

    kind = "slurm"
    detached = True

    def __init__(
        self,
        config: ExecutorConfig,
        *,
        python: str,
        env: Mapping[str, str] | None = None,
        default_time_limit_s: float = 3600.0,
        cli: SlurmCli | None = None,
    ) -> None:
        if config.kind != "slurm" or config.partition is None or config.job_dir is None:
            raise ExecutorError('SlurmExecutor needs [executor] kind = "slurm" with partition and job_dir')
        self._config = config
        self._partition: str = config.partition
        self._job_dir: Path = config.job_dir
        self._python = str(config.python) if config.python is not None else python
        self._time = config.time_limit_minutes(default_time_limit_s)
        self._env = submission_environment(os.environ if env is None else env, config)
        self.cli = cli or SlurmCli(self._env)
        #: Slurm job ids this executor cancelled itself: their CANCELLED is evald's, not someone's.
        self._cancelled: set[str] = set()

    @property
    def job_dir(self) -> Path:
        return self._job_dir

    @property
    def config(self) -> ExecutorConfig:
        return self._config

    # --- naming ---------------------------------------------------------------------------------------

    def job_name(self, job: JobRef) -> str:
        return slurm_script.job_name(self._config.name_prefix, job)

    def comment(self, job: JobRef) -> str:
        return slurm_script.comment(self._config.name_prefix, job)

    def parse_comment(self, comment: str) -> JobRef | None:
        """The evald job a comment of :meth:`comment`'s names; None for anyone else's job."""
        return slurm_script.parse_comment(self._config.name_prefix, comment)

    def job_folder(self, job: JobRef) -> Path:
        """Where the runner writes ``spec.json`` for ``job``: ``<job_dir>/<job id>-<attempt>``."""
        return self._job_dir / f"{job.job_id}-{job.attempt}"

    # --- checks ---------------------------------------------------------------------------------------

    def check(self) -> None:
        """The configured partition exists and the job folder is writable here; :class:`ExecutorError`
        names what is wrong. (Whether the compute nodes see the folder only a job can tell.)"""
        try:
            partitions = self.cli.partitions()
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer: {exc.message}") from exc
        except SlurmError as exc:
            raise ExecutorError(f"cannot list Slurm's partitions: {exc}") from exc
        if self._partition not in partitions:
            raise ExecutorError(self._no_partition(partitions))
        probe = self._job_dir / f".evald-write-check-{os.getpid()}"
        try:
            probe.write_text("ok", encoding="utf-8")
            probe.unlink()
        except OSError as exc:
            raise ExecutorError(f"executor.job_dir {self._job_dir} is not writable: {exc.strerror}") from exc

    def probe_job_dir(self) -> Handle:
        """Submit a job that reads back a token written here into ``job_dir``: whether the compute nodes
        see the folder only a job there can tell. Read its answer with :meth:`probe_result`."""
        folder = self._job_dir / f".probe-{uuid.uuid4().hex[:12]}"
        folder.mkdir()
        token = uuid.uuid4().hex
        (folder / "token").write_text(token, encoding="utf-8")
        script = slurm_script.probe_script(self._config, folder)
        (folder / "probe.sbatch").write_text(script, encoding="utf-8")
        try:
            slurm_id = self.cli.submit(folder / "probe.sbatch")
        except SubmitRejected as exc:
            raise ExecutorError(self._explain_rejection(exc)) from exc
        except SlurmError as exc:
            raise ExecutorUnavailable(f"cannot submit the job folder probe: {exc.message}") from exc
        return Handle(self.kind, 0, 0, folder, slurm_id)

    def probe_result(self, probe: Handle) -> bool | None:
        """True once the probe job read the token back (its folder is removed); None while it waits or
        runs; :class:`ExecutorError` naming the folder and the node where the job did not see it."""
        status = self.poll(probe)
        if isinstance(status, Active):
            return None
        token = (
            (probe.job_dir / "token").read_text(encoding="utf-8")
            if (probe.job_dir / "token").exists()
            else ""
        )
        seen = ""
        with contextlib.suppress(OSError):
            seen = (probe.job_dir / "seen").read_text(encoding="utf-8")
        node = status.placement.nodes or "its node"
        if token and seen.split(" ", 1)[0] == token:
            shutil.rmtree(probe.job_dir, ignore_errors=True)
            return True
        if status.kind is not EndKind.FAILED:
            raise ExecutorError(f"the job folder probe did not run to its end: {status.detail}")
        raise ExecutorError(
            f"executor.job_dir {self._job_dir} is not shared with the compute nodes: a job on {node} "
            f"could not read {probe.job_dir / 'token'} (mount the folder there, or pick one that is)"
        )

    def _no_partition(self, partitions: list[str]) -> str:
        return (
            f"executor.partition: Slurm has no partition {self._partition!r} "
            f"(its partitions: {', '.join(partitions) or 'none'})"
        )

    # --- the batch script ---------------------------------------------------------------------------

    def layout(self, spec: JobSpec) -> Layout:
        return slurm_script.layout(self._config, spec)

    def batch_script(self, spec: JobSpec, spec_path: Path, job: JobRef) -> str:
        """The script submitted for ``job`` (see :func:`slurm_script.batch_script`)."""
        return slurm_script.batch_script(
            self._config, spec, spec_path, job, python=self._python, time=self._time
        )

    # --- the protocol ---------------------------------------------------------------------------------

    def start(self, spec_path: Path, job: JobRef) -> Handle:
        """Submit the job folder of ``spec_path``. :class:`ExecutorError`: the submission was refused
        (a bad partition, account, QoS, time limit). :class:`ExecutorUnavailable`: slurmctld did not
        answer, and ``sbatch`` may or may not have queued it: :meth:`find` before submitting again."""
        folder = spec_path.parent.resolve()
        if not folder.is_relative_to(self._job_dir.resolve()):
            raise ExecutorError(f"job folder {folder} is outside executor.job_dir {self._job_dir}")
        try:
            spec = JobSpec.model_validate_json(spec_path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ExecutorError(f"cannot read {spec_path}: {exc}") from exc
        if spec.result_path.parent.resolve() != folder:
            raise ExecutorError(f"{spec_path}: result_path {spec.result_path} is not in the job's folder")
        script = folder / SCRIPT_NAME
        for stale in (folder / EXIT_NAME, folder / ID_NAME):
            stale.unlink(missing_ok=True)
        script.write_text(self.batch_script(spec, spec_path, job), encoding="utf-8")
        try:
            slurm_id = self.cli.submit(script)
        except SubmitRejected as exc:
            raise ExecutorError(self._explain_rejection(exc)) from exc
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer (sbatch: {exc.message})") from exc
        except SlurmError as exc:
            raise ExecutorError(f"sbatch failed: {exc.message}") from exc
        (folder / ID_NAME).write_text(slurm_id + "\n", encoding="utf-8")
        log.info(
            "slurm.submitted",
            job_id=job.job_id,
            attempt=job.attempt,
            slurm_job_id=slurm_id,
            partition=self._partition,
            ranks=spec.inference.world_size,
        )
        return Handle(self.kind, job.job_id, job.attempt, folder, slurm_id)

    def _explain_rejection(self, exc: SubmitRejected) -> str:
        said = exc.message
        if "partition" in said.lower():
            with contextlib.suppress(SlurmError):
                return f"{self._no_partition(self.cli.partitions())}; sbatch said: {said}"
        return f"sbatch refused the job: {said}"

    def poll(self, handle: Handle) -> Status:
        """The job's state from the controller, else accounting, else its folder.
        :class:`ExecutorUnavailable` while slurmctld does not answer."""
        try:
            job = self.cli.show(handle.external_id)
            if job is None:
                job = self.cli.accounting(handle.external_id)
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer: {exc.message}") from exc
        except SlurmError as exc:
            raise ExecutorUnavailable(f"cannot read Slurm job {handle.external_id}: {exc}") from exc
        if job is None:
            return self._from_folder(handle)
        return self._status(job, handle)

    def cancel(self, handle: Handle) -> None:
        self._cancelled.add(handle.external_id)
        try:
            self.cli.cancel(handle.external_id)
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer (scancel: {exc.message})") from exc
        log.info(
            "slurm.cancelled", job_id=handle.job_id, attempt=handle.attempt, slurm_job_id=handle.external_id
        )

    def find(self, job: JobRef) -> Handle | None:
        """A submission for ``job`` the controller still holds (by name and comment), or one its folder
        records; submissions beyond the first still queued or running are cancelled, never run twice."""
        try:
            queue = self.cli.queue()
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer: {exc.message}") from exc
        name = self.job_name(job)
        mine = [
            j
            for j in queue
            if j.name == name
            and (ref := self.parse_comment(j.comment)) is not None
            and (ref.job_id, ref.attempt) == (job.job_id, job.attempt)
        ]
        # The oldest submission is adopted (it has waited longest); any later one is a double.
        mine.sort(key=lambda j: int(j.job_id))
        folder = self.job_folder(job)
        if mine:
            keep, *doubles = mine
            for double in doubles:
                if not double.finished:
                    self.cancel(Handle(self.kind, job.job_id, job.attempt, folder, double.job_id))
                    log.warning(
                        "slurm.double_cancelled",
                        job_id=job.job_id,
                        slurm_job_id=double.job_id,
                        kept=keep.job_id,
                    )
            return Handle(self.kind, job.job_id, job.attempt, folder, keep.job_id)
        with contextlib.suppress(OSError, ValueError):
            recorded = (folder / ID_NAME).read_text(encoding="utf-8").strip()
            if recorded.isdigit():
                return Handle(self.kind, job.job_id, job.attempt, folder, recorded)
        return None

    # --- limits and the queue for evald status -------------------------------------------------------

    def active(self) -> list[tuple[JobRef, SlurmJob]]:
        """This daemon's jobs the controller holds that have not ended (queued, running, requeued)."""
        try:
            queue = self.cli.queue()
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer: {exc.message}") from exc
        out = []
        for job in queue:
            ref = self.parse_comment(job.comment)
            if ref is not None and not job.finished and job.name.startswith(f"{self._config.name_prefix}-"):
                out.append((ref, job))
        return out

    def room(self, run: str, active: list[tuple[JobRef, SlurmJob]] | None = None) -> bool:
        """Whether another job of ``run`` may be submitted under ``max_queued``/``max_queued_per_run``."""
        jobs = self.active() if active is None else active
        if len(jobs) >= self._config.max_queued:
            return False
        per_run = self._config.max_queued_per_run
        return per_run is None or sum(ref.run == run for ref, _ in jobs) < per_run

    # --- outcomes -------------------------------------------------------------------------------------

    def _status(self, job: SlurmJob, handle: Handle) -> Status:
        placement = _placement(job)
        state = job.state
        if state in _PENDING_STATES:
            phase = Phase.REQUEUED if job.restarts else Phase.PENDING
            return Active(phase, job.reason, placement)
        if state in _REQUEUED_STATES:
            return Active(Phase.REQUEUED, job.reason, placement)
        if state in _RUNNING_STATES:
            return Active(Phase.RUNNING, None, placement)
        if state in _HELD_STATES:
            return Active(Phase.HELD, job.reason, placement)
        where = f" on {job.nodes}" if job.nodes else ""
        limit = f" (limit {_clock(job.time_limit_s)})" if job.time_limit_s else ""
        ran = f" after {_clock(job.run_s)}" if job.run_s is not None else ""
        if state == "COMPLETED":
            return self._exited(handle, 0, placement, f"Slurm job {job.job_id} COMPLETED{ran}{where}")
        if state in {"FAILED", "SPECIAL_EXIT", "REVOKED"}:
            code = job.exit_code if job.exit_code is not None else _exit_file(handle.job_dir)
            detail = f"Slurm job {job.job_id} {state}{ran}{where}: {_describe(code, job.exit_signal)}"
            return self._exited(handle, code, placement, detail)
        kind = _ENDS.get(state, EndKind.FAILED)
        detail = f"Slurm job {job.job_id} {state}{ran}{where}{limit if kind is EndKind.TIMEOUT else ''}"
        if kind is EndKind.CANCELLED:
            who = "by evald" if job.job_id in self._cancelled else "outside evald (scancel)"
            detail = f"Slurm job {job.job_id} cancelled {who}{' while pending' if not job.nodes else ran}"
        return Ended(
            kind,
            detail,
            exit_code=job.exit_code,
            log_tail=self._log_tail(handle.job_dir),
            placement=placement,
        )

    def _exited(self, handle: Handle, code: int | None, placement: Placement, detail: str) -> Ended:
        if code == 0:
            result = _result(handle.job_dir)
            if result is not None:
                return Ended(EndKind.SUCCEEDED, detail, exit_code=0, placement=placement)
            return Ended(
                EndKind.FAILED,
                f"{detail}, but the worker wrote no result.json",
                exit_code=0,
                log_tail=self._log_tail(handle.job_dir),
                placement=placement,
            )
        kind = EndKind.OUT_OF_MEMORY if code == EXIT_OUT_OF_MEMORY else EndKind.FAILED
        return Ended(
            kind, detail, exit_code=code, log_tail=self._log_tail(handle.job_dir), placement=placement
        )

    def _from_folder(self, handle: Handle) -> Ended:
        """The job's end from what its script left, once Slurm has forgotten it and has no accounting."""
        code = _exit_file(handle.job_dir)
        forgotten = f"Slurm job {handle.external_id} is no longer known to the controller"
        if code is not None:
            return self._exited(handle, code, Placement(), f"{forgotten}; its script exited {code}")
        if _result(handle.job_dir) is not None:
            return Ended(EndKind.SUCCEEDED, f"{forgotten}; its result was written", placement=Placement())
        return Ended(
            EndKind.LOST,
            f"{forgotten} (it forgets ended jobs after MinJobAge) and left no {EXIT_NAME} in "
            f"{handle.job_dir}; sacct has no record either",
            log_tail=self._log_tail(handle.job_dir),
        )

    def _log_tail(self, folder: Path) -> str:
        """The end of the failed rank's log, where srun named one, else of the batch log."""
        batch = stderr_tail(folder / LOG_NAME, limit=20000)
        for match in _SRUN_TASK.finditer(batch):
            rank_log = folder / f"rank-{match.group(1)}.log"
            if rank_log.is_file():
                return f"rank {match.group(1)} failed; its log ends: {stderr_tail(rank_log)}"
        return stderr_tail(folder / LOG_NAME)


def _placement(job: SlurmJob) -> Placement:
    return Placement(
        state=job.state,
        nodes=job.nodes,
        partition=job.partition,
        submitted=job.submit_time,
        started=job.start_time,
        ended=job.end_time,
        restarts=job.restarts,
    )


def _exit_file(folder: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((folder / EXIT_NAME).read_text(encoding="utf-8"))["exit_code"])
    return None


def _result(folder: Path) -> JobResult | None:
    with contextlib.suppress(OSError, ValueError):
        result = JobResult.read(folder / "result.json")
        return result if result.error is None else None
    return None


def _describe(code: int | None, signal: int | None) -> str:
    if signal:
        return f"killed by signal {signal}"
    return "exit status unknown" if code is None else f"exit status {code}"


def _clock(seconds: float | None) -> str:
    total = int(seconds or 0)
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"
