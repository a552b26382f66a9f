"""The Slurm executor: each job one ``sbatch``, polled through ``scontrol``/``sacct`` (their states mean
what :mod:`.slurm_states` says), cancelled with ``scancel``.

The job folder (under ``[executor] job_dir``, on a filesystem the compute nodes share) holds what the
local executor's does — ``spec.json`` in; ``result.json``, ``result.rank<N>.json``, ``rank-<N>.log`` out —
plus ``job.sbatch`` (the script as submitted), ``worker.log`` (its output), ``slurm_job_id`` (written by
the daemon after ``sbatch`` and by the script when it starts) and ``exit.json`` (the worker's exit status,
written by the script as it ends). Every job, a single rank too, is started with ``srun``, one task a
rank (``srun_options`` apply to each: a container), its rendezvous (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ...) taken from ``SLURM_*`` and ``rendezvous_interface``. A success is read from the folder
(:meth:`SlurmExecutor.ended_here`) before Slurm is asked; what the job folder and its probes leave behind
is cleaned up by :mod:`.slurm_upkeep`.

Each job is named ``<prefix>-<job id>-<attempt>`` and carries ``<prefix>:job=<id>:attempt=<n>:run=<run>``
as its comment, so that a daemon that died between ``sbatch`` and recording the Slurm job id finds the
submission again (:meth:`SlurmExecutor.find`) instead of submitting it twice.

The scheduler's word on how a job ended is read from ``scontrol show job`` while the controller holds
it (``MinJobAge`` after the end), else from ``sacct`` where accounting answers, else from the folder's
``exit.json`` and result file.

A job's next attempt may be submitted with :class:`Adjustments`: a longer ``--time`` after a TIMEOUT
(within ``max_time_limit`` and the partition's MaxTime), and ``--exclude`` of the nodes that failed under
it (dropped where that would leave the partition too few nodes).

A refusal of ``sbatch`` is the config's (every option of the script comes from it, so every job would be
refused): :class:`ExecutorMisconfigured` names the setting, and the refused script is kept beside the job
folders (``.refused-<prefix>.json``) so that :meth:`SlurmExecutor.check` (the daemon's, every minute
and at a reload, and ``evald status``'s) asks ``sbatch --test-only`` whether Slurm takes it now. Only a
refusal that the retry's adjustments alone cause is the job's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import structlog

from daemon.config import ExecutorConfig
from daemon.config.executor import slurm_time
from daemon.running.executors import job_dirs, slurm_script, slurm_states, slurm_upkeep
from daemon.running.executors.base import (
    Adjustments,
    Ended,
    ExecutorError,
    ExecutorMisconfigured,
    ExecutorUnavailable,
    Handle,
    JobRef,
    Placement,
    SharedFolder,
    Status,
)
from daemon.running.executors.slurm_cli import SlurmCli
from daemon.running.executors.slurm_output import (
    SlurmError,
    SlurmJob,
    SlurmUnreachable,
    SubmitRejected,
    refusal,
)
from daemon.running.executors.slurm_script import (
    EXIT_NAME,
    ID_NAME,
    SCRIPT_NAME,
    Layout,
    submission_environment,
)
from daemon.running.executors.slurm_states import clock
from inference.spec import JobSpec

log = structlog.get_logger("evald.executor.slurm")

#: Seconds an ended submission may seem older than its claim and still be the claim's (Slurm's times are
#: whole seconds, and the controller's clock may be a little behind the daemon's).
FIND_SLACK_S = 5.0


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
        setup_key: str = "",
    ) -> None:
        if config.kind != "slurm" or config.partition is None or config.job_dir is None:
            raise ExecutorError('SlurmExecutor needs [executor] kind = "slurm" with partition and job_dir')
        self._config = config
        self._partition: str = config.partition
        self._job_dir: Path = config.job_dir
        self._python = str(config.python) if config.python is not None else python
        self._time = config.time_limit_minutes(default_time_limit_s)
        self._time_s = config.time_limit_secs(default_time_limit_s)
        self._max_time_s = config.max_time_limit_secs(default_time_limit_s)
        #: The partition's MaxTime in seconds as the last check read it (None: no limit, or not read).
        self._partition_max_s: int | None = None
        self._env = submission_environment(os.environ if env is None else env, config)
        self.cli = cli or SlurmCli(self._env)
        #: Slurm job ids this executor cancelled itself: their CANCELLED is evald's, not someone's.
        self._cancelled: set[str] = set()
        #: What the batch script is made of (the config's [executor] and [inference]): a refusal kept
        #: under another key is another config's, and not this one's to repeat.
        self._key = hashlib.sha256(
            f"{setup_key}|{config.model_dump_json()}|{self._python}|{self._time}".encode()
        ).hexdigest()[:16]

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

    # --- time limits --------------------------------------------------------------------------------

    @property
    def time_limit_s(self) -> int:
        """The time limit of a job's first attempt, in seconds."""
        return self._time_s

    @property
    def max_time_limit_s(self) -> int:
        """The most a job's time limit is raised to after TIMEOUTs: ``max_time_limit``, within the
        partition's MaxTime as the last :meth:`check` read it, and never below the time limit."""
        most = self._max_time_s
        if self._partition_max_s is not None:
            most = min(most, self._partition_max_s)
        return max(self._time_s, most)

    def time_limits(self) -> tuple[int, int] | None:
        return self._time_s, self.max_time_limit_s

    # --- checks ---------------------------------------------------------------------------------------

    def check(self) -> None:
        """The configured partition exists and takes the time limit, the job folder is writable here,
        and a job Slurm refused for this config would be taken now (``sbatch --test-only``);
        :class:`ExecutorError` names what is wrong. (Whether the compute nodes see the folder only a job
        can tell.)"""
        try:
            limits = self.cli.partition_limits()
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer: {exc.message}") from exc
        except SlurmError as exc:
            raise ExecutorError(f"cannot list Slurm's partitions: {exc}") from exc
        if self._partition not in limits:
            raise ExecutorError(self._no_partition(list(limits)))
        most = self._partition_max_s = limits[self._partition]
        if most is not None and self._time_s > most:
            raise ExecutorError(
                f"executor.time_limit: {clock(self._time_s)} is more than partition {self._partition!r} "
                f"allows (MaxTime {clock(most)}): its jobs would wait forever (PartitionTimeLimit)"
            )
        probe = self._job_dir / f".evald-write-check-{os.getpid()}"
        try:
            probe.write_text("ok", encoding="utf-8")
            probe.unlink()
        except OSError as exc:
            raise ExecutorError(f"executor.job_dir {self._job_dir} is not writable: {exc.strerror}") from exc
        self._check_refusal()

    @property
    def refusal_path(self) -> Path:
        """Where the script Slurm last refused for this config is kept (see the module's docstring)."""
        return self._job_dir / f".refused-{self._config.name_prefix}.json"

    def _keep_refusal(self, error: str, script: str) -> None:
        record = {"key": self._key, "error": error, "script": script, "at": time.time()}
        with contextlib.suppress(OSError):
            tmp = self.refusal_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record), encoding="utf-8")
            tmp.replace(self.refusal_path)

    def _check_refusal(self) -> None:
        """:class:`ExecutorMisconfigured` while Slurm still refuses the script it refused for this config
        (``sbatch --test-only``); once it would take it, the record is removed."""
        try:
            record = json.loads(self.refusal_path.read_text(encoding="utf-8"))
            key, error, script = str(record["key"]), str(record["error"]), str(record["script"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if key != self._key:
            return  # another config's: this one has not been refused yet
        try:
            self.cli.test_submit(script)
        except SubmitRejected as exc:
            raise ExecutorMisconfigured(error) from exc
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer: {exc.message}") from exc
        except SlurmError as exc:
            raise ExecutorMisconfigured(error) from exc
        with contextlib.suppress(OSError):
            self.refusal_path.unlink()

    def probe_job_dir(self, also: Sequence[SharedFolder] = ()) -> Handle:
        """Submit a job that reads back a token written here into ``job_dir`` and into each folder of
        ``also``: whether the compute nodes see them only a job there can tell. Read its answer with
        :meth:`probe_result`."""
        return slurm_upkeep.submit_probe(self, also)

    def probe_result(self, probe: Handle) -> bool | None:
        """The probe's answer (see :func:`slurm_upkeep.probe_answer`)."""
        return slurm_upkeep.probe_answer(self, probe)

    def tidy(self, busy: Collection[int], keep: Collection[Path] = ()) -> list[Path]:
        """Remove ended jobs' folders past their retention (see :mod:`.job_dirs`) and cancel a dead
        daemon's probes (:mod:`.slurm_upkeep`); ``busy``: job ids running anywhere. Runs on a thread."""
        slurm_upkeep.cancel_stale_probes(self)
        return job_dirs.tidy(
            self._job_dir, self._config, busy=busy, keep=keep, event="slurm.job_dirs_removed"
        )

    def _no_partition(self, partitions: list[str]) -> str:
        return (
            f"executor.partition: Slurm has no partition {self._partition!r} "
            f"(its partitions: {', '.join(partitions) or 'none'})"
        )

    # --- the batch script ---------------------------------------------------------------------------

    def layout(self, spec: JobSpec) -> Layout:
        return slurm_script.layout(self._config, spec)

    def batch_script(
        self, spec: JobSpec, spec_path: Path, job: JobRef, adjust: Adjustments | None = None
    ) -> str:
        """The script submitted for ``job`` (see :func:`slurm_script.batch_script`), with ``adjust``'s
        time limit and failed nodes (see :meth:`_exclusion`)."""
        time_limit = self._time
        if adjust is not None and adjust.time_limit_s is not None and adjust.time_limit_s != self._time_s:
            time_limit = slurm_time(adjust.time_limit_s)
        failed = self._exclusion(adjust.exclude, self.layout(spec).nodes) if adjust is not None else []
        return slurm_script.batch_script(
            self._config, spec, spec_path, job, python=self._python, time=time_limit, failed_nodes=failed
        )

    def _exclusion(self, failed: tuple[str, ...], needed: int) -> list[str]:
        """The nodes of ``failed`` (node lists of attempts that ended NODE_FAIL) to keep a job off: those
        of the partition, unless that leaves it fewer than ``needed`` nodes (then none: a run on a node
        that failed once beats a job that waits forever)."""
        if not failed:
            return []
        try:
            nodes = self.cli.partition_nodes(self._partition)
            kept = self.cli.hostnames(self._config.exclude or "")
            names = list(dict.fromkeys(n for expr in failed for n in self.cli.hostnames(expr)))
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer: {exc.message}") from exc
        except SlurmError as exc:
            log.warning("slurm.exclude_dropped", failed=list(failed), reason=f"cannot list the nodes: {exc}")
            return []
        out = [n for n in names if n in nodes and n not in kept]
        left = [n for n in nodes if n not in out and n not in kept]
        if len(left) < needed:
            log.warning(
                "slurm.exclude_dropped",
                failed=out,
                partition=self._partition,
                reason=f"the partition would keep {len(left)} node(s) for a job of {needed}",
            )
            return []
        return out

    # --- the protocol ---------------------------------------------------------------------------------

    def start(self, spec_path: Path, job: JobRef, adjust: Adjustments | None = None) -> Handle:
        """Submit the job folder of ``spec_path``, with ``adjust``'s time limit and excluded nodes.
        :class:`ExecutorMisconfigured`: sbatch refused it for the config's sake (a partition, feature,
        GRES, account, QoS); :class:`ExecutorError`: for the job's (its adjustments, its folder).
        :class:`ExecutorUnavailable`: slurmctld did not answer, and ``sbatch`` may or may not have
        queued it: :meth:`find` before submitting again."""
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
        text = self.batch_script(spec, spec_path, job, adjust)
        script.write_text(text, encoding="utf-8")
        try:
            slurm_id = self.cli.submit(script)
        except SubmitRejected as exc:
            plain = self.batch_script(spec, spec_path, job) if adjust else text
            raise self.refused(exc, text, plain) from exc
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
            time_limit=None if adjust is None else adjust.time_limit_s,
            exclude=_option(text, "--exclude"),
        )
        return Handle(self.kind, job.job_id, job.attempt, folder, slurm_id)

    def refused(self, exc: SubmitRejected, script: str, plain: str | None = None) -> ExecutorError:
        """What sbatch's refusal of ``script`` is: the job's, when the script without the retry's
        adjustments (``plain``) would be taken; else the config's (:class:`ExecutorMisconfigured`,
        naming the setting, and kept for :meth:`check`)."""
        said = exc.message
        if plain is not None and plain != script:
            with contextlib.suppress(SlurmError):
                self.cli.test_submit(plain)
                changed = ", ".join(
                    f"{name}={value}"
                    for name in ("--time", "--exclude")
                    if (value := _option(script, name)) != _option(plain, name) and value is not None
                )
                return ExecutorError(f"sbatch refused this job's retry with {changed}: {said}")
            script = plain
        error = self._explain(said)
        self._keep_refusal(error, script)
        return ExecutorMisconfigured(error)

    def _explain(self, said: str) -> str:
        """sbatch's refusal with the setting it points at and what the partition has instead."""
        cause = refusal(said)
        if "invalid partition" in said.lower():
            with contextlib.suppress(SlurmError):
                return f"{self._no_partition(self.cli.partitions())}; sbatch said: {said}"
        facts = ""
        with contextlib.suppress(SlurmError):
            if cause.field in ("executor.extra_sbatch", "executor.gpu_request"):
                features, gres = self.cli.partition_offers(self._partition)
                if "feature" in cause.hint:
                    facts = f"; its nodes' features: {', '.join(features) or 'none'}"
                elif "GPU" in cause.hint or "gres" in cause.hint.lower():
                    facts = f"; its nodes' GRES: {', '.join(gres) or 'none'}"
        value = {
            "executor.account": self._config.account,
            "executor.qos": self._config.qos,
            "executor.mem": self._config.mem,
            "executor.exclude": self._config.exclude,
        }.get(cause.field)
        setting = f" = {value!r}" if value is not None else ""
        return (
            f"{cause.field}{setting}: sbatch refused the job for partition {self._partition!r} "
            f"({cause.hint}{facts}): {said}"
        )

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
            return slurm_states.from_folder(handle)
        return slurm_states.status(job, handle, self._cancelled)

    def ended_here(self, handle: Handle, last: Placement) -> Ended | None:
        """The job's success from its folder alone (see :func:`slurm_states.finished_here`): no Slurm call."""
        return slurm_states.finished_here(handle, last)

    def cancel(self, handle: Handle) -> None:
        self._cancelled.add(handle.external_id)
        try:
            self.cli.cancel(handle.external_id)
        except SlurmUnreachable as exc:
            raise ExecutorUnavailable(f"slurmctld does not answer (scancel: {exc.message})") from exc
        log.info(
            "slurm.cancelled", job_id=handle.job_id, attempt=handle.attempt, slurm_job_id=handle.external_id
        )

    def find(self, job: JobRef, since: float | None = None) -> Handle | None:
        """A submission for ``job`` the controller still holds (by name and comment), or one its folder
        records; submissions beyond the first still queued or running are cancelled, never run twice.
        One that ended before ``since`` (the claim's start) is an earlier claim's under the same number
        (preempted, or cancelled when its run left the config) and not this claim's."""
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
            and not (j.finished and since is not None and (j.submit_time or 0.0) < since - FIND_SLACK_S)
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
            record = folder / ID_NAME
            recorded = record.read_text(encoding="utf-8").strip()
            if recorded.isdigit() and (since is None or record.stat().st_mtime >= since - FIND_SLACK_S):
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


def _option(script: str, name: str) -> str | None:
    """The value of ``#SBATCH NAME=VALUE`` in a batch script, if it has one."""
    for line in script.splitlines():
        if line.startswith(f"#SBATCH {name}="):
            return line.split("=", 1)[1]
    return None
