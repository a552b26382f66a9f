"""``[executor]``: where evaluations run — on the daemon's node (``local``) or through Slurm.

Validated like the rest of the config (each problem names its field path:
``executor.partition: required when kind = "slurm"``); :func:`daemon.config.loader.parse_executor` reads
this section alone from a parsed config file.

A complete Slurm section::

    [executor]
    kind = "slurm"
    partition = "gpu"
    job_dir = "/shared/evald/jobs"      # a folder the daemon's node and the compute nodes both see
    account = "rl-team"
    qos = "normal"
    time_limit = "2:00:00"              # Slurm's format; default: inference.job_timeout_secs
    max_time_limit = "8:00:00"          # raised to after TIMEOUTs (doubled each); default 4 × time_limit
    nodes = 1                           # tp × dp ranks split evenly over these
    extra_sbatch = ["--constraint=a100", "--exclusive"]
    setup_script = "/shared/evald/env.sh"   # sourced before the worker starts (modules, venv)
    max_queued = 8                      # evald jobs queued or running at once, in all
    max_queued_per_run = 2
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from daemon.config.base import Section, existing_file, resolve_path
from daemon.config.executor_ray import RayConfig

ExecutorKind = Literal["local", "slurm", "ray"]

#: Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds.
_TIME_LIMIT = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$"
)

#: Options evald sets itself in every batch script, long and short forms, with what to set instead: an
#: ``extra_sbatch`` line comes last and would override them.
_SET_BY_EVALD = "is set by evald itself for every job"
RESERVED_SBATCH: dict[str, str] = {
    "--job-name": _SET_BY_EVALD,
    "-J": _SET_BY_EVALD,
    "--comment": _SET_BY_EVALD,
    "--output": _SET_BY_EVALD,
    "-o": _SET_BY_EVALD,
    "--error": _SET_BY_EVALD,
    "-e": _SET_BY_EVALD,
    "--open-mode": _SET_BY_EVALD,
    "--chdir": _SET_BY_EVALD,
    "-D": _SET_BY_EVALD,
    "--parsable": _SET_BY_EVALD,
    "--ntasks": "is set by evald from [inference] tp × dp (one task a rank)",
    "-n": "is set by evald from [inference] tp × dp (one task a rank)",
    "--ntasks-per-node": "is set by evald from [inference] tp × dp and executor.nodes",
    "--array": "is not used: every job is its own sbatch",
    "-a": "is not used: every job is its own sbatch",
    "--wrap": _SET_BY_EVALD,
    "--time": "is set by evald: set executor.time_limit (and executor.max_time_limit) instead",
    "-t": "is set by evald: set executor.time_limit (and executor.max_time_limit) instead",
    "--partition": "is set by evald: set executor.partition instead",
    "-p": "is set by evald: set executor.partition instead",
    "--nodes": "is set by evald: set executor.nodes instead",
    "-N": "is set by evald: set executor.nodes instead",
    "--cpus-per-task": "is set by evald: set executor.cpus_per_task instead",
    "-c": "is set by evald: set executor.cpus_per_task instead",
    "--export": (
        "is set by evald (--export=ALL: the job gets the worker environment): "
        "list variables in [inference] worker_env, or set them in executor.setup_script"
    ),
    "--export-file": (
        "feeds the job an environment evald does not control (variables read from a file): list variables "
        "in [inference] worker_env, or set them in executor.setup_script"
    ),
    "--requeue": "is set by evald: set executor.requeue instead",
    "--no-requeue": "is set by evald: set executor.requeue instead",
    "--account": "is set by evald: set executor.account instead",
    "-A": "is set by evald: set executor.account instead",
    "--qos": "is set by evald: set executor.qos instead",
    "-q": "is set by evald: set executor.qos instead",
    "--mem": "is set by evald: set executor.mem instead",
    "--exclude": "is set by evald (it adds nodes that failed a job): set executor.exclude instead",
    "-x": "is set by evald (it adds nodes that failed a job): set executor.exclude instead",
}


#: What evald's srun sets for every rank; a ``srun_options`` line may not set it again.
RESERVED_SRUN: dict[str, str] = {
    "--ntasks": "is set by evald from [inference] tp × dp (one task a rank)",
    "-n": "is set by evald from [inference] tp × dp (one task a rank)",
    "--ntasks-per-node": "is set by evald from [inference] tp × dp and executor.nodes",
    "--cpus-per-task": "is set by evald: set executor.cpus_per_task instead",
    "-c": "is set by evald: set executor.cpus_per_task instead",
    "--kill-on-bad-exit": "is set by evald (a rank that fails ends the others)",
    "-K": "is set by evald (a rank that fails ends the others)",
    "--nodes": "is set by the allocation: set executor.nodes instead",
    "-N": "is set by the allocation: set executor.nodes instead",
}

#: pyxis's options on ``sbatch`` run the batch script itself in the container, where ``srun`` is not.
_CONTAINER = (
    "runs the batch script itself in the container (pyxis), where srun cannot start the ranks: "
    "put it in executor.srun_options (evald starts every rank, a single one too, with srun)"
)


def sbatch_option(line: str) -> str:
    """The option an ``extra_sbatch`` line gives: ``--time`` of ``--time=5`` or ``--time 5``, ``-t`` of
    ``-t 5`` or ``-t5``."""
    text = line.strip()
    if text.startswith("--"):
        return re.split(r"[=\s]", text, maxsplit=1)[0]
    return text[:2]


def reserved_sbatch(option: str) -> str | None:
    """Why ``option`` may not be an ``extra_sbatch`` line (None: it may), abbreviations included:
    sbatch takes ``--tim=5`` as ``--time`` when that is the only option it begins."""
    if option in RESERVED_SBATCH:
        return RESERVED_SBATCH[option]
    # No sbatch option is a prefix of a reserved one but ``--ntasks`` and ``--export`` (reserved too), so a
    # prefix is an abbreviation sbatch would read as a reserved option (or refuse as ambiguous).
    if option.startswith("--") and len(option) > 2:
        for name, why in RESERVED_SBATCH.items():
            if name.startswith(option):
                return f"(an abbreviation of {name}) {why}"
    return None


def slurm_seconds(text: str) -> int:
    """Seconds of a Slurm time limit (``90`` minutes, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``); ValueError for anything else."""
    value = text.strip()
    if not _TIME_LIMIT.match(value):
        raise ValueError(f"{text!r} is not a Slurm time limit")
    days = 0
    if "-" in value:
        head, value = value.split("-", 1)
        days = int(head)
        parts = [int(p) for p in value.split(":")]
        hours, minutes, seconds = [*parts, 0, 0][:3]
    else:
        parts = [int(p) for p in value.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def slurm_time(seconds: int) -> str:
    """``seconds`` as a Slurm time limit: whole minutes (``120``), else ``H:MM:SS``."""
    if seconds % 60 == 0:
        return str(seconds // 60)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


#: How much longer a job may run after each TIMEOUT, and the default most (``max_time_limit``) as a
#: multiple of the time limit: two raises, one a retry within the default three attempts.
TIME_LIMIT_GROWTH = 2
DEFAULT_MAX_TIME_FACTOR = 4


#: Settings only a Slurm executor reads; set under ``kind = "local"`` they are a mistake to report.
_SLURM_ONLY = (
    "partition",
    "job_dir",
    "account",
    "qos",
    "time_limit",
    "mem",
    "cpus_per_task",
    "extra_sbatch",
    "setup_script",
    "slurm_conf",
    "max_time_limit",
    "exclude",
    "srun_options",
    "rendezvous_interface",
)


#: Settings of Slurm's alone; set under ``kind = "ray"`` they are a mistake to report (``job_dir``,
#: ``python``, the time limits, ``name_prefix`` and the queue limits serve both).
_SLURM_ONLY_UNDER_RAY = (
    "partition",
    "account",
    "qos",
    "mem",
    "cpus_per_task",
    "extra_sbatch",
    "setup_script",
    "slurm_conf",
    "exclude",
    "srun_options",
    "rendezvous_interface",
)


class ExecutorConfig(Section):
    #: ``local``: process groups on the daemon's node (today's behaviour); ``slurm``: one ``sbatch`` a job;
    #: ``ray``: one Ray job a job, its ranks in a placement group (``[executor.ray]``).
    kind: ExecutorKind = "local"
    #: The partition jobs are submitted to (required for ``slurm``).
    partition: str | None = Field(default=None, validate_default=True)
    #: The folder for job files (spec in, results and logs out), on a filesystem the daemon's node and
    #: the compute nodes share (required for ``slurm``; must exist).
    job_dir: Path | None = Field(default=None, validate_default=True)
    account: str | None = None
    qos: str | None = None
    #: Slurm's time limit per job (``90``, ``1:30:00``, ``1-00:00:00``); None: the inference section's
    #: ``job_timeout_secs``, rounded up to whole minutes.
    time_limit: str | None = None
    #: The most a job's time limit is raised to: each TIMEOUT doubles it for the next attempt, up to this
    #: (and within the partition's MaxTime); a job that times out at it fails. None: 4 × time_limit.
    max_time_limit: str | None = None
    #: Nodes per job: the tp × dp ranks are split evenly over them.
    nodes: int = Field(default=1, ge=1)
    #: How GPUs are asked for: ``gpus-per-node`` (``--gpus-per-node=N``) or ``gres`` (``--gres=gpu:N``).
    gpu_request: Literal["gpus-per-node", "gres"] = "gpus-per-node"
    #: CPUs per rank; None: the inference section's ``threads``, else 1.
    cpus_per_task: int | None = Field(default=None, ge=1)
    #: Memory per node (``--mem``: ``64G``); None leaves the partition's default.
    mem: str | None = None
    #: Nodes no job may use (``--exclude``, Slurm's node list: ``node[3-4],node7``); evald adds the nodes
    #: that failed under a job (NODE_FAIL) for that job's next attempts.
    exclude: str | None = None
    #: More ``#SBATCH`` lines, each one option (``--constraint=a100``); evald's own options
    #: (``--time``, ``--partition``, ``--nodes``, ``--cpus-per-task``, ``--export``, ``--requeue``, ...)
    #: are refused, with the setting to use instead.
    extra_sbatch: tuple[str, ...] = ()
    #: Options of the ``srun`` that starts every rank (a single one too), each one option: a container
    #: (pyxis: ``--container-image=...``, ``--container-mounts=...``), ``--mpi=pmix``, ``--gpu-bind``.
    #: The options evald's srun sets (``--ntasks``, ``--cpus-per-task``, ...) are refused.
    srun_options: tuple[str, ...] = ()
    #: A shell script sourced in the batch script before the worker starts (``module load``, a
    #: virtualenv); it runs on the job's first node, outside any ``srun_options`` container.
    setup_script: Path | None = None
    #: The interpreter on the compute nodes; None: the inference section's ``python``, else the daemon's.
    python: Path | None = None
    #: ``SLURM_CONF`` for the Slurm tools the daemon runs (None: their default, /etc/slurm/slurm.conf).
    slurm_conf: Path | None = None
    #: Let Slurm requeue a preempted or failed job as the same attempt; off, evald submits it again.
    requeue: bool = False
    #: Preemptions in a row that spend no attempt: the job goes back to evald's queue as it was. Past
    #: them each preemption spends an attempt like a failure, so a job preempted forever is retried
    #: (``evald status``: retrying, kind ``preempted``) and fails after ``max_attempts`` more.
    free_preemptions: int = Field(default=10, ge=0)
    #: The job name prefix (``evald-<job>-<attempt>``): two daemons on one cluster must differ.
    name_prefix: str = Field(default="evald", pattern=r"^[A-Za-z0-9_.]+$")
    #: evald jobs queued or running at once, in all and per run.
    max_queued: int = Field(default=16, ge=1)
    max_queued_per_run: int | None = Field(default=None, ge=1)
    #: Which queued job is submitted first when there is room: the newest checkpoint, or the schedule's
    #: order (stages, then priority).
    priority: Literal["newest", "schedule"] = "schedule"
    #: How often the scheduler is asked about running jobs.
    poll_secs: float = Field(default=10.0, gt=0)
    #: At start (and reload), submit one tiny job that reads back a token written into ``job_dir``: the
    #: only proof that the compute nodes see the folder. Jobs are submitted meanwhile; a probe that fails
    #: stops submission with one ``executor.unusable`` line naming the folder and the node.
    probe_job_dir: bool = True
    #: Seconds a Slurm or Ray job's folder (``<job_dir>/<job>-<attempt>``: spec, result, logs) is kept
    #: after the job succeeded (its results are in the database by then); 0 removes it at the next clean-up.
    keep_job_dirs_secs: float = Field(default=3600.0, ge=0)
    #: Seconds the folder of a job that failed, was cancelled or left no result is kept, for its logs
    #: (and a job folder probe's ``.probe-*`` folder that did not answer).
    keep_failed_job_dirs_secs: float = Field(default=7 * 86400.0, ge=0)
    #: The network interface the ranks of a multi-node job meet on (``ib0``, ``eth0``): exported as
    #: ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``, and ``MASTER_ADDR`` is that interface's address
    #: on the job's first node. Unset: the first node's hostname, and the libraries' own choice.
    rendezvous_interface: str | None = None

    #: The Ray cluster and what each rank asks of it (read when ``kind = "ray"``).
    ray: RayConfig = RayConfig()

    @field_validator("rendezvous_interface")
    @classmethod
    def _interface_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.\-]{1,15}", value):
            raise ValueError(
                f"{value!r} is not a network interface name (like ib0 or eth0: up to 15 letters, digits, "
                "'.', '_' or '-'; `ip -br link` on a compute node lists them)"
            )
        return value

    @field_validator("partition", "job_dir", mode="after")
    @classmethod
    def _required_for_slurm(cls, value: object, info: ValidationInfo) -> object:
        if info.data.get("kind") == "slurm" and value is None:
            raise ValueError('required when kind = "slurm"')
        return value

    @field_validator("job_dir", mode="after")
    @classmethod
    def _required_for_ray(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if info.data.get("kind") == "ray" and value is None:
            raise ValueError('required when kind = "ray" (a folder the daemon and the Ray nodes share)')
        return value

    @field_validator(*_SLURM_ONLY_UNDER_RAY, mode="after")
    @classmethod
    def _slurm_not_ray(cls, value: object, info: ValidationInfo) -> object:
        empty = value is None or value == ()
        if info.data.get("kind") == "ray" and not empty:
            raise ValueError('applies only to kind = "slurm" (for Ray see [executor.ray])')
        return value

    @field_validator("ray", mode="after")
    @classmethod
    def _ray_only(cls, value: RayConfig, info: ValidationInfo) -> RayConfig:
        if info.data.get("kind") != "ray" and value != RayConfig():
            raise ValueError('applies only to kind = "ray"')
        return value

    @field_validator("partition", "account", "qos", "mem", "exclude")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise ValueError(f"{value!r} is not a Slurm name (empty or with spaces)")
        return value

    @field_validator("job_dir", mode="after")
    @classmethod
    def _job_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = resolve_path(value, info)
        # Slurm reads %j, %x, ... in --output as patterns, and #SBATCH lines split at spaces.
        if "%" in str(path) or any(c.isspace() for c in str(path)):
            raise ValueError(f"{path}: a job folder for Slurm may not contain '%' or spaces")
        if not path.is_dir():
            raise ValueError(f"folder not found: {path} (create it on the shared filesystem)")
        return path

    @field_validator("setup_script", "slurm_conf", mode="after")
    @classmethod
    def _file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return existing_file(value, info)

    @field_validator("python", mode="after")
    @classmethod
    def _python(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        # Not checked for existence: the path is the compute nodes', which this node may not have.
        return None if value is None else resolve_path(value, info)

    @field_validator("time_limit", "max_time_limit")
    @classmethod
    def _time_limit(cls, value: str | None) -> str | None:
        if value is not None and not _TIME_LIMIT.match(value.strip()):
            raise ValueError(
                f"{value!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)"
            )
        return None if value is None else value.strip()

    @field_validator("extra_sbatch")
    @classmethod
    def _extra_sbatch(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems = []
        for i, line in enumerate(value):
            option = sbatch_option(line)
            if not line.strip().startswith("-") or "\n" in line:
                problems.append(f'[{i}] {line!r} is not one sbatch option (like "--constraint=a100")')
            elif (why := reserved_sbatch(option)) is not None:
                problems.append(f"[{i}] {option} {why}")
            elif option.startswith("--container-"):
                problems.append(f"[{i}] {option} {_CONTAINER}")
        if problems:
            raise ValueError("; ".join(problems))
        return tuple(line.strip() for line in value)

    @field_validator("srun_options")
    @classmethod
    def _srun_options(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems = []
        for i, line in enumerate(value):
            option = sbatch_option(line)
            if not line.strip().startswith("-") or "\n" in line:
                problems.append(f'[{i}] {line!r} is not one srun option (like "--container-image=IMAGE")')
            elif option in RESERVED_SRUN:
                problems.append(f"[{i}] {option} {RESERVED_SRUN[option]}")
        if problems:
            raise ValueError("; ".join(problems))
        return tuple(line.strip() for line in value)

    @field_validator("max_time_limit")
    @classmethod
    def _max_time_limit(cls, value: str | None, info: ValidationInfo) -> str | None:
        least = info.data.get("time_limit")
        if value is not None and isinstance(least, str) and slurm_seconds(value) < slurm_seconds(least):
            raise ValueError(f"{value!r} is less than time_limit = {least!r}")
        return value

    @field_validator("max_queued_per_run")
    @classmethod
    def _per_run(cls, value: int | None, info: ValidationInfo) -> int | None:
        total = info.data.get("max_queued")
        if value is not None and isinstance(total, int) and value > total:
            raise ValueError(f"{value} is more than max_queued = {total}")
        return value

    @field_validator(*_SLURM_ONLY, mode="after")
    @classmethod
    def _slurm_only(cls, value: object, info: ValidationInfo) -> object:
        empty = value is None or value == ()
        if info.data.get("kind") == "local" and not empty:
            raise ValueError('applies only to kind = "slurm"')
        return value

    def time_limit_minutes(self, default_secs: float) -> str:
        """The ``--time`` value: the configured limit, else ``default_secs`` rounded up to minutes."""
        if self.time_limit is not None:
            return self.time_limit
        return str(max(1, -(-int(default_secs) // 60)))

    def time_limit_secs(self, default_secs: float) -> int:
        """The time limit a job's first attempt gets, in seconds."""
        return slurm_seconds(self.time_limit_minutes(default_secs))

    def max_time_limit_secs(self, default_secs: float) -> int:
        """The most a job's time limit is raised to after TIMEOUTs (never less than the limit itself)."""
        least = self.time_limit_secs(default_secs)
        if self.max_time_limit is None:
            return least * DEFAULT_MAX_TIME_FACTOR
        return max(least, slurm_seconds(self.max_time_limit))
