"""The Ray executor: each attempt one named Ray job (Jobs API) whose driver starts the ranks in a
placement group of tp × dp bundles.

The job folder (under ``[executor] job_dir``, on a filesystem the daemon and every Ray node share, as
for Slurm) holds what the other executors' does — ``spec.json`` in; ``result.json``,
``result.rank<N>.json``, ``rank-<N>.log`` (``worker.log`` for a job of one rank) out — plus
``ray_driver.py`` and ``ray_job.json`` (the driver as submitted and what it runs: bundles, strategy, the
ranks' command and environment, the time limit), ``driver.log``, ``ray_state.json`` (placing or
running, written by the driver) and ``exit.json`` (how the ranks ended, written by the driver as it
ends). See :mod:`.ray_driver` for what the driver does on the cluster.

Exactly once: the Ray job's submission id is ``<name_prefix>-<job id>-<attempt>`` (the folder's name),
and Ray refuses a second job of one id; a daemon that died between submitting and recording the handle
finds the job by that id (:meth:`RayExecutor.find`); a start that meets a live job of its id adopts it
instead of submitting again. The driver's placement group carries the same name, in ``[executor.ray]
namespace``.

Outcomes: ``PENDING`` (the job, or its placement group, waits for resources: the reason names the
bundles and Ray's scheduling state), ``RUNNING``; then SUCCEEDED, FAILED (the failed rank's log tail),
NODE_FAIL (a rank's node died), OUT_OF_MEMORY (Ray's memory monitor, or the worker's own report),
TIMEOUT (``time_limit``, or ``placement_timeout_secs``), INFEASIBLE (Ray said the placement group is
INFEASIBLE for ``infeasible_timeout_secs``: no node can hold it; not retried), CANCELLED (``ray job
stop``, by evald or someone), LOST (the cluster forgot the job — its head restarted — and the folder
holds no end): the mapping is :mod:`.ray_states`'s; the Jobs API client :mod:`.ray_client`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from daemon.config import Config, ExecutorConfig
from daemon.running.executors import folder_probe, job_dirs, ray_states
from daemon.running.executors.base import (
    Adjustments,
    Ended,
    EndKind,
    ExecutorError,
    ExecutorMisconfigured,
    ExecutorUnavailable,
    Handle,
    JobRef,
    Placement,
    SharedFolder,
    Status,
)
from daemon.running.executors.ray_client import (
    JobExists,
    RayJob,
    RayJobs,
    RayRefused,
    RayUnreachable,
    ray_installed,
)
from inference.spec import JobSpec

log = structlog.get_logger("evald.executor.ray")

DRIVER_NAME = "ray_driver.py"
JOB_NAME = "ray_job.json"
STATE_NAME = ray_states.STATE_NAME
EXIT_NAME = ray_states.EXIT_NAME
LOG_NAME = ray_states.LOG_NAME
DRIVER_LOG = ray_states.DRIVER_LOG
CANCEL_NAME = "cancelled.json"
#: The driver's source, copied into each job folder (it runs on the cluster, never imported here).
DRIVER_SOURCE = Path(__file__).with_name("ray_driver.py")

#: Seconds an ended job may seem older than its claim and still be the claim's (clocks differ a little).
FIND_SLACK_S = 5.0


#: The probe's entrypoint: a task asking for a rank's resources reads a token from the job folder, then
#: what it can of the token files given after it (a line each, empty where it cannot: see
#: :mod:`.folder_probe`).
_PROBE = """\
import json, socket, sys
from pathlib import Path
import ray
ray.init()
@ray.remote(max_retries=0)
def seen(folder, also):
    path = Path(folder)
    lines = [(path / "token").read_text() + " " + socket.gethostname()]
    for name in also:
        try:
            lines.append(Path(name).read_text().strip())
        except OSError:
            lines.append("")
    (path / "seen.tmp").write_text("\\n".join(lines))
    (path / "seen.tmp").replace(path / "seen")
print(ray.get(seen.options(**json.loads(sys.argv[2])).remote(sys.argv[1], sys.argv[3:])))
"""


class RayExecutor:
    """Runs job folders as Ray jobs (see the module's docstring)."""

    kind = "ray"
    detached = True

    def __init__(
        self,
        config: ExecutorConfig,
        *,
        python: str,
        env: Mapping[str, str] | None = None,
        default_time_limit_s: float = 3600.0,
        jobs: RayJobs | None = None,
    ) -> None:
        if config.kind != "ray" or config.job_dir is None:
            raise ExecutorError('RayExecutor needs [executor] kind = "ray" with job_dir')
        self._config = config
        self._ray = config.ray
        self._job_dir: Path = config.job_dir
        self._python = str(config.python) if config.python is not None else python
        self._driver_python = self._ray.driver_python or self._python
        self._time_s = config.time_limit_secs(default_time_limit_s)
        self._max_time_s = config.max_time_limit_secs(default_time_limit_s)
        source = os.environ if env is None else env
        #: The allow-list's values: nothing else of the daemon's environment reaches the cluster.
        self._env = {name: source[name] for name in self._ray.env_vars if name in source}
        self.jobs = jobs or RayJobs(self._ray.address)
        #: Submission ids this executor stopped itself (the folder's ``cancelled.json`` says it too).
        self._cancelled: set[str] = set()

    @property
    def job_dir(self) -> Path:
        return self._job_dir

    @property
    def config(self) -> ExecutorConfig:
        return self._config

    def job_name(self, job: JobRef) -> str:
        return f"{self._config.name_prefix}-{job.job_id}-{job.attempt}"

    def job_folder(self, job: JobRef) -> Path:
        return self._job_dir / f"{job.job_id}-{job.attempt}"

    def time_limits(self) -> tuple[int, int] | None:
        """The driver stops the ranks at the time limit (Ray has none of its own); a TIMEOUT raises it
        for the next attempt up to ``max_time_limit``."""
        return self._time_s, max(self._time_s, self._max_time_s)

    # --- checks -------------------------------------------------------------------------------------

    def check(self) -> None:
        """The Jobs API answers, a rank asks for something, and the job folder is writable here."""
        try:
            self.jobs.version()
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        except RayRefused as exc:
            raise ExecutorError(f"executor.ray.address {self._ray.address}: {exc}") from exc
        if not self._bundle(cuda=False) and not self._bundle(cuda=True):
            raise ExecutorError("executor.ray: a rank asks for nothing (num_cpus = 0, no GPUs, no resources)")
        probe = self._job_dir / f".evald-write-check-{os.getpid()}"
        try:
            probe.write_text("ok", encoding="utf-8")
            probe.unlink()
        except OSError as exc:
            raise ExecutorError(f"executor.job_dir {self._job_dir} is not writable: {exc.strerror}") from exc

    def _bundle(self, *, cuda: bool) -> dict[str, float]:
        """What one rank asks for (its bundle, and its task's resources)."""
        gpus = self._ray.num_gpus if self._ray.num_gpus is not None else (1.0 if cuda else 0.0)
        bundle = {"CPU": self._ray.num_cpus, "GPU": gpus, **self._ray.resources}
        return {k: v for k, v in bundle.items() if v > 0}

    def _rank_options(self, cuda: bool) -> dict[str, Any]:
        bundle = self._bundle(cuda=cuda)
        custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
        return {
            "num_cpus": bundle.get("CPU", 0),
            "num_gpus": bundle.get("GPU", 0),
            **({"resources": custom} if custom else {}),
        }

    # --- the protocol -------------------------------------------------------------------------------

    def start(self, spec_path: Path, job: JobRef, adjust: Adjustments | None = None) -> Handle:
        """Submit the job folder of ``spec_path`` as a Ray job (``adjust``: a longer time limit; nodes
        are not excluded: a Ray node that failed comes back under a new id).
        :class:`ExecutorMisconfigured`: Ray refused it for the config's sake (the runtime_env, the
        driver's interpreter); :class:`ExecutorUnavailable`: the head did not answer (:meth:`find`
        before submitting again)."""
        folder = spec_path.parent.resolve()
        if not folder.is_relative_to(self._job_dir.resolve()):
            raise ExecutorError(f"job folder {folder} is outside executor.job_dir {self._job_dir}")
        try:
            spec = JobSpec.model_validate_json(spec_path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ExecutorError(f"cannot read {spec_path}: {exc}") from exc
        if spec.result_path.parent.resolve() != folder:
            raise ExecutorError(f"{spec_path}: result_path {spec.result_path} is not in the job's folder")
        name = f"{self._config.name_prefix}-{folder.name}"
        limit = adjust.time_limit_s if adjust is not None and adjust.time_limit_s else self._time_s
        description = self._description(spec, spec_path, job, name, limit)
        for stale in (EXIT_NAME, STATE_NAME, CANCEL_NAME):
            (folder / stale).unlink(missing_ok=True)
        shutil.copyfile(DRIVER_SOURCE, folder / DRIVER_NAME)
        (folder / JOB_NAME).write_text(json.dumps(description, indent=1), encoding="utf-8")
        entrypoint = " ".join(
            shlex.quote(part)
            for part in (self._driver_python, str(folder / DRIVER_NAME), str(folder / JOB_NAME))
        )
        metadata = {
            "evald": self._config.name_prefix,
            "job": str(job.job_id),
            "attempt": str(job.attempt),
            "run": job.run,
            "task": job.task,
        }
        try:
            self._submit(name, entrypoint, metadata)
        except JobExists:
            if self._take_existing(name):
                return Handle(self.kind, job.job_id, job.attempt, folder, name)
            self._submit(name, entrypoint, metadata)
        log.info(
            "ray.submitted",
            job_id=job.job_id,
            attempt=job.attempt,
            ray_job=name,
            ranks=spec.inference.world_size,
            strategy=self._ray.placement_strategy,
            time_limit=limit,
        )
        return Handle(self.kind, job.job_id, job.attempt, folder, name)

    def _description(
        self, spec: JobSpec, spec_path: Path, job: JobRef, name: str, limit: float | None
    ) -> dict[str, Any]:
        """What the driver reads (``job.json``): the placement group's bundles, each rank's options and
        command, the time limit."""
        cuda = spec.inference.device.startswith("cuda")
        return {
            "name": name,
            "namespace": self._ray.namespace,
            "world_size": spec.inference.world_size,
            "bundles": [self._bundle(cuda=cuda)] * spec.inference.world_size,
            "strategy": self._ray.placement_strategy,
            "placement_timeout_s": self._ray.placement_timeout_secs,
            "infeasible_timeout_s": self._ray.infeasible_timeout_secs,
            "rank_options": self._rank_options(cuda),
            "command": [self._python, "-m", "inference.worker", str(spec_path)],
            "env": {} if cuda else {"DS_ACCELERATOR": "cpu"},
            "time_limit_s": limit,
            "job": job.job_id,
            "attempt": job.attempt,
        }

    def _submit(self, name: str, entrypoint: str, metadata: dict[str, str]) -> None:
        try:
            self.jobs.submit(
                submission_id=name,
                entrypoint=entrypoint,
                runtime_env=self._ray.runtime_env(self._env),
                metadata=metadata,
            )
        except JobExists:
            raise
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        except RayRefused as exc:
            # Everything submitted is the config's (runtime_env, interpreter, address): every job alike.
            raise ExecutorMisconfigured(f"executor.ray: Ray refused the job {name}: {exc}") from exc

    def _take_existing(self, name: str) -> bool:
        """A job of this id exists: adopted while it has not ended (True); an ended one is an earlier
        claim's under the same attempt number, removed so that this one can be submitted (False)."""
        try:
            existing = self.jobs.info(name)
            if existing is not None and not existing.finished:
                log.warning("ray.adopted", ray_job=name, status=existing.status)
                return True
            if existing is not None:
                self.jobs.delete(name)
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        except RayRefused as exc:
            raise ExecutorError(f"Ray job {name} exists and cannot be replaced: {exc}") from exc
        return False

    def poll(self, handle: Handle) -> Status:
        """The job's state from the Jobs API and its folder; :class:`ExecutorUnavailable` while the head
        does not answer."""
        try:
            job = self.jobs.info(handle.external_id)
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        except RayRefused as exc:
            raise ExecutorUnavailable(f"cannot read Ray job {handle.external_id}: {exc}") from exc
        if job is None:
            return self._from_folder(
                handle, f"Ray no longer knows job {handle.external_id} (its head restarted?)"
            )
        return self._status(job, handle)

    def cancel(self, handle: Handle) -> None:
        self._cancelled.add(handle.external_id)
        with contextlib.suppress(OSError):
            (handle.job_dir / CANCEL_NAME).write_text(
                json.dumps({"by": "evald", "at": time.time()}), encoding="utf-8"
            )
        try:
            self.jobs.stop(handle.external_id)
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        except RayRefused as exc:
            log.warning("ray.cancel_refused", ray_job=handle.external_id, error=str(exc))
            return
        log.info("ray.cancelled", job_id=handle.job_id, attempt=handle.attempt, ray_job=handle.external_id)

    def find(self, job: JobRef, since: float | None = None) -> Handle | None:
        """The Ray job of ``job`` (by its submission id), unless it ended before ``since`` (the claim's
        start: then it is an earlier claim's under the same number)."""
        name = self.job_name(job)
        try:
            found = self.jobs.info(name)
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        if found is None:
            return None
        if found.finished and since is not None and (found.start_time or 0.0) < since - FIND_SLACK_S:
            return None
        return Handle(self.kind, job.job_id, job.attempt, self.job_folder(job), name)

    def ended_here(self, handle: Handle, last: Placement) -> Ended | None:
        """The job's success as its folder tells it (the driver's ``exit.json``, a result without an
        error), before Ray is asked; None otherwise (how a job failed is Ray's to say, at the poll)."""
        record = ray_states.read_json(handle.job_dir / EXIT_NAME)
        if record.get("end") != "succeeded" or ray_states.result(handle.job_dir) is None:
            return None
        where = dataclasses.replace(last, state="SUCCEEDED", nodes=str(record.get("nodes") or last.nodes))
        return Ended(
            EndKind.SUCCEEDED, f"Ray job {handle.external_id}: every rank exited 0", 0, placement=where
        )

    def active(self) -> list[tuple[JobRef, RayJob]]:
        """This daemon's Ray jobs (``name_prefix``) that have not ended."""
        try:
            jobs = self.jobs.jobs()
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        out = []
        for job in jobs:
            meta = job.metadata
            if meta.get("evald") == self._config.name_prefix and not job.finished:
                with contextlib.suppress(KeyError, ValueError):
                    ref = JobRef(
                        int(meta["job"]), int(meta["attempt"]), meta.get("run", ""), meta.get("task", "")
                    )
                    out.append((ref, job))
        return out

    # --- the job folder probe ---------------------------------------------------------------------------

    def probe_job_dir(self, also: Sequence[SharedFolder] = ()) -> Handle:
        """Submit a job whose task (with a rank's resources) reads back a token written here into
        ``job_dir`` and into each folder of ``also`` (see :mod:`.folder_probe`); read its answer with
        :meth:`probe_result`."""
        folder, files = folder_probe.make(self._job_dir, also)
        options = json.dumps(self._rank_options(cuda=False))
        name = f"{self._config.name_prefix}-probe-{folder.name[7:]}"
        entrypoint = " ".join(
            shlex.quote(str(p)) for p in (self._driver_python, "-c", _PROBE, folder, options, *files)
        )
        try:
            self._submit(name, entrypoint, {"evald": self._config.name_prefix, "probe": "1"})
        except JobExists as exc:
            folder_probe.remove(folder)
            raise ExecutorError(f"probe job {name} exists") from exc
        except (ExecutorError, ExecutorUnavailable):
            folder_probe.remove(folder)  # no answer will be read
            raise
        return Handle(self.kind, 0, 0, folder, name)

    def probe_result(self, probe: Handle) -> bool | None:
        """True once the probe read every token back (its folder removed); None while it waits or runs;
        :class:`ExecutorError` naming the folders (``job_dir``, else each other one) where a task did not
        see them. The tokens in other folders are removed once it answers."""
        try:
            job = self.jobs.info(probe.external_id)
        except RayUnreachable as exc:
            raise ExecutorUnavailable(str(exc)) from exc
        if job is not None and not job.finished:
            return None
        token = ""
        seen = ""
        with contextlib.suppress(OSError):
            token = (probe.job_dir / "token").read_text(encoding="utf-8")
            seen = (probe.job_dir / "seen").read_text(encoding="utf-8")
        if token and seen.split(" ", 1)[0] == token:
            missed = folder_probe.unread(probe.job_dir, token, seen)
            folder_probe.remove(probe.job_dir)
            shutil.rmtree(probe.job_dir, ignore_errors=True)
            if missed:
                host = seen.split("\n", 1)[0].partition(" ")[2].strip() or "its node"
                raise ExecutorError(
                    folder_probe.not_shared(missed, nodes="the Ray nodes", runner=f"a task on {host}")
                )
            return True
        folder_probe.remove(probe.job_dir)
        said = ray_states.stderr_tail_text(self.jobs.logs(probe.external_id))
        raise ExecutorError(
            f"executor.job_dir {self._job_dir} is not shared with the Ray nodes: a task there could not "
            f"read {probe.job_dir / 'token'} (mount the folder on every node, or pick one that is): {said}"
        )

    def tidy(self, busy: Collection[int], keep: Collection[Path] = ()) -> list[Path]:
        """Remove ended jobs' folders and unanswered probes' past their retention (see :mod:`.job_dirs`);
        ``busy``: job ids running anywhere. Runs on a thread."""
        return job_dirs.tidy(self._job_dir, self._config, busy=busy, keep=keep, event="ray.job_dirs_removed")

    # --- outcomes -----------------------------------------------------------------------------------

    def _status(self, job: RayJob, handle: Handle) -> Status:
        return ray_states.status(
            job, handle, self._ray.placement_strategy, self._by_evald(handle), self.jobs.logs
        )

    def _from_folder(self, handle: Handle, said: str) -> Ended:
        return ray_states.from_folder(handle, said, self._by_evald(handle), self.jobs.logs)

    def _by_evald(self, handle: Handle) -> bool:
        return handle.external_id in self._cancelled or (handle.job_dir / CANCEL_NAME).exists()


def make_ray_executor(config: Config, environ: Mapping[str, str] | None = None) -> RayExecutor:
    """The executor of ``[executor] kind = "ray"`` for a whole config (its [inference] python and job
    timeout); :class:`ExecutorError` where the ray package is missing."""
    if not ray_installed():
        raise ExecutorError("executor.kind = \"ray\" needs the ray package: pip install 'evald[ray]'")
    return RayExecutor(
        config.executor,
        python=str(config.inference.python or sys.executable),
        env=os.environ if environ is None else environ,
        default_time_limit_s=config.inference.job_timeout_secs,
    )
