"""``[scheduling]``: when checkpoints are read and evaluated, what a job waits for, and two-stage tasks.

Also the plain values the scheduler works with that the section hands it: a run's :class:`Frequency`
(its step, epoch and time triggers) and the resource :class:`Thresholds` a job must find free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from daemon import units
from daemon.config.base import Section, Written
from daemon.config.runs import Backlog, RunConfig
from inference.spec import SubsetSpec


@dataclass(frozen=True)
class Frequency:
    steps: int | None = None
    epochs: int | None = None
    secs: float | None = None

    @property
    def every_checkpoint(self) -> bool:
        return self.steps is None and self.epochs is None and self.secs is None

    def describe(self) -> str:
        parts = [
            f"{name}={value:g}"
            for name, value in (
                ("freq_steps", self.steps),
                ("freq_epochs", self.epochs),
                ("freq_secs", self.secs),
            )
            if value is not None
        ]
        return ", ".join(parts) or "every checkpoint"


@dataclass(frozen=True)
class Thresholds:
    """What must hold before a job starts; ``None`` means not checked."""

    min_gpu_free_bytes: int | None = None
    max_gpu_utilization_percent: float | None = None
    min_host_free_bytes: int | None = None

    @property
    def gpu_thresholds_set(self) -> bool:
        return self.min_gpu_free_bytes is not None or self.max_gpu_utilization_percent is not None

    @property
    def any_set(self) -> bool:
        return self.gpu_thresholds_set or self.min_host_free_bytes is not None


class TwoStageConfig(Section):
    """A quick stage on a fixed subset at every due checkpoint, the full set only now and then."""

    #: Items in the quick stage's subset, taken from the task's rows (after ``limit`` and ``subset``).
    quick_size: int = Field(ge=1)
    #: Dataset field to stratify the quick subset by (difficulty level, subject, ...).
    stratify_field: str | None = None
    #: Seed of the quick subset's draw: the same seed takes the same items at every checkpoint.
    seed: int = 0
    #: The full stage runs on the 1st, (n+1)th, (2n+1)th ... evaluated checkpoint.
    full_every: int = Field(default=5, ge=1)
    #: The metric whose quick result, when a new best or an anomaly candidate, triggers the full stage.
    watch_metric: str = "accuracy"
    #: A quick result further than this many combined standard errors from the previous one is an
    #: anomaly candidate.
    anomaly_sigmas: float = Field(default=3.0, gt=0)

    def subset(self) -> SubsetSpec:
        return SubsetSpec(size=self.quick_size, seed=self.seed, stratify_field=self.stratify_field)


def _memory(value: object) -> int | None:
    return None if value is None else units.parse_memory(value)


#: A memory size in the config file: a string with a unit, stored as bytes.
MemorySize = Annotated[int, Written('size with a unit, such as "20GiB" or "512MB"')]
#: A percentage in the config file: ``"80%"`` or a number, stored as a number.
Percent = Annotated[float, Written('percentage, such as "80%"')]


class ResourcesConfig(Section):
    """What the evaluation node must have free before a job starts; unset means not checked."""

    #: Free memory on every GPU the job uses, with a unit: ``"20GiB"``.
    min_gpu_free_memory: MemorySize | None = None
    #: Utilisation of every GPU the job uses, in percent: ``"80%"``.
    max_gpu_utilization: Percent | None = None
    #: Available host memory, with a unit: ``"8GiB"``.
    min_host_free_memory: MemorySize | None = None
    #: NVML indices of the GPUs evaluations use; default: those in CUDA_VISIBLE_DEVICES, else all.
    gpus: tuple[int, ...] | None = None

    @field_validator("min_gpu_free_memory", "min_host_free_memory", mode="before")
    @classmethod
    def _memory_size(cls, value: object) -> int | None:
        return _memory(value)

    @field_validator("max_gpu_utilization", mode="before")
    @classmethod
    def _percent(cls, value: object) -> float | None:
        return None if value is None else units.parse_percent(value)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and (not value or min(value) < 0 or len(set(value)) != len(value)):
            raise ValueError("must list distinct GPU indices (0, 1, ...), at least one")
        return value

    def thresholds(self) -> Thresholds:
        return Thresholds(
            min_gpu_free_bytes=self.min_gpu_free_memory,
            max_gpu_utilization_percent=self.max_gpu_utilization,
            min_host_free_bytes=self.min_host_free_memory,
        )


class SchedulingConfig(Section):
    """When checkpoints are read and evaluated, how many jobs run at once, and the daemon's timers."""

    #: A checkpoint must stay unchanged this long before it is read (ignored when a marker is set).
    quiet_secs: float = Field(default=5.0, ge=0)
    #: A checkpoint still incomplete after this long unchanged is marked invalid.
    invalid_after_secs: float = Field(default=300.0, gt=0)
    #: The periodic full rescan, the safety net under filesystem events.
    rescan_secs: float = Field(default=30.0, gt=0)
    #: How often the main loop wakes when nothing happens.
    tick_secs: float = Field(default=0.2, gt=0, le=10)
    #: Jobs this daemon runs at once on its node, each a worker group of tp × dp ranks (with Slurm,
    #: ``[executor] max_queued`` bounds the jobs submitted instead).
    max_concurrent: int = Field(default=1, ge=1)
    #: A running job whose heartbeat is older than this is taken to be orphaned (PostgreSQL).
    lease_secs: float = Field(default=120.0, gt=0)
    #: How often a running job's heartbeat (its lease) is renewed; at most half of ``lease_secs``.
    heartbeat_secs: float = Field(default=10.0, gt=0)
    #: How often a daemon on PostgreSQL looks for orphaned jobs: another daemon's job is taken over at
    #: most this long after its lease ran out.
    recover_secs: float = Field(default=5.0, gt=0)
    #: On SIGTERM, how long a running job may finish before it is requeued.
    shutdown_grace_secs: float = Field(default=20.0, ge=0)
    #: Default frequency for every run (a run's own fields win). A checkpoint is due when ANY set trigger
    #: fires; with none set, every checkpoint is due. ``freq_steps``: due this many steps after the last
    #: one evaluated.
    freq_steps: int | None = Field(default=None, ge=1)
    #: Due this many epochs after the last one evaluated (needs epochs in the checkpoint names, or a run's
    #: ``steps_per_epoch``).
    freq_epochs: int | None = Field(default=None, ge=1)
    #: Due this many seconds after the last evaluation: the newest ready checkpoint is taken, older
    #: waiting ones skipped.
    freq_secs: float | None = Field(default=None, gt=0)
    #: Which due checkpoint runs first when several wait: the newest then backfill, the oldest, or only
    #: the newest (older due ones are skipped).
    backlog: Backlog = "newest_first"
    resources: ResourcesConfig = ResourcesConfig()
    #: How often deferred jobs look at the resources again.
    recheck_secs: float = Field(default=15.0, gt=0)
    #: A job deferred longer than this raises a ``job.stuck`` event.
    stuck_after_secs: float = Field(default=3600.0, gt=0)
    #: Housekeeping: stuck jobs, and the final checkpoint of runs that went quiet.
    housekeeping_secs: float = Field(default=60.0, gt=0)
    #: Two-stage: the newest checkpoint counts as final once no newer one appeared for this long.
    final_after_secs: float = Field(default=3600.0, gt=0)
    #: Per task name: evaluate it in two stages (see :class:`TwoStageConfig`).
    two_stage: dict[str, TwoStageConfig] = Field(default_factory=dict)

    def frequency_for(self, run: RunConfig) -> Frequency:
        """The run's own triggers, each unset one taken from ``[scheduling]``."""
        return Frequency(
            steps=run.freq_steps if run.freq_steps is not None else self.freq_steps,
            epochs=run.freq_epochs if run.freq_epochs is not None else self.freq_epochs,
            secs=run.freq_secs if run.freq_secs is not None else self.freq_secs,
        )

    def backlog_for(self, run: RunConfig) -> Backlog:
        return run.backlog or self.backlog

    @model_validator(mode="after")
    def _lease(self) -> SchedulingConfig:
        if self.heartbeat_secs * 2 > self.lease_secs:
            raise ValueError("lease_secs must be at least twice heartbeat_secs")
        return self
