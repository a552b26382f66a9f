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

ExecutorKind = Literal["local", "slurm"]

#: Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds.
_TIME_LIMIT = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2})$"
)

#: Options evald sets itself in every batch script: an extra line must not change them.
RESERVED_SBATCH = frozenset(
    {
        "--job-name",
        "-J",
        "--comment",
        "--output",
        "-o",
        "--error",
        "-e",
        "--chdir",
        "-D",
        "--parsable",
        "--ntasks",
        "-n",
        "--ntasks-per-node",
        "--array",
        "-a",
        "--wrap",
    }
)

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
)


class ExecutorConfig(Section):
    #: ``local``: process groups on the daemon's node (today's behaviour); ``slurm``: one ``sbatch`` a job.
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
    #: Nodes per job: the tp × dp ranks are split evenly over them.
    nodes: int = Field(default=1, ge=1)
    #: How GPUs are asked for: ``gpus-per-node`` (``--gpus-per-node=N``) or ``gres`` (``--gres=gpu:N``).
    gpu_request: Literal["gpus-per-node", "gres"] = "gpus-per-node"
    #: CPUs per rank; None: the inference section's ``threads``, else 1.
    cpus_per_task: int | None = Field(default=None, ge=1)
    #: Memory per node (``--mem``: ``64G``); None leaves the partition's default.
    mem: str | None = None
    #: More ``#SBATCH`` lines, each one option (``--constraint=a100``).
    extra_sbatch: tuple[str, ...] = ()
    #: A shell script sourced in the batch script before the worker starts (modules, a virtualenv).
    setup_script: Path | None = None
    #: The interpreter on the compute nodes; None: the inference section's ``python``, else the daemon's.
    python: Path | None = None
    #: ``SLURM_CONF`` for the Slurm tools the daemon runs (None: their default, /etc/slurm/slurm.conf).
    slurm_conf: Path | None = None
    #: Let Slurm requeue a preempted or failed job as the same attempt; off, each run is an attempt.
    requeue: bool = False
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

    @field_validator("partition", "job_dir", mode="after")
    @classmethod
    def _required_for_slurm(cls, value: object, info: ValidationInfo) -> object:
        if info.data.get("kind") == "slurm" and value is None:
            raise ValueError('required when kind = "slurm"')
        return value

    @field_validator("partition", "account", "qos", "mem")
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

    @field_validator("time_limit")
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
            option = line.strip().split("=", 1)[0].split(" ", 1)[0]
            if not line.strip().startswith("-") or "\n" in line:
                problems.append(f'[{i}] {line!r} is not one sbatch option (like "--constraint=a100")')
            elif option in RESERVED_SBATCH:
                problems.append(f"[{i}] {option} is set by evald itself for every job")
        if problems:
            raise ValueError("; ".join(problems))
        return tuple(line.strip() for line in value)

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
