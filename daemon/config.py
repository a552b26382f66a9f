"""The TOML config, typed and validated once at load.

Every problem is reported with its path in the file (``tasks[1].dataset: file not found: ...``), all of
them at once. Relative paths are relative to the config file. ``EVALD_<SECTION>_<FIELD>`` environment
variables override scalar fields of the top-level sections (``EVALD_DATABASE_URL``), so secrets and the
database URL need not live in the file.
"""

from __future__ import annotations

import errno
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from daemon import units
from daemon.config_paths import base_dir, resolve_path
from daemon.errors import ConfigError
from daemon.executor_config import ExecutorConfig
from daemon.scheduling import frequency, resources
from daemon.trackers.config import TrackerConfig, tracker_problems
from inference import layouts
from inference.errors import TaskInvalid
from inference.metrics import DEFAULT_METRICS, resolve_metrics
from inference.spec import Engine, HarnessSpec, InferenceSpec, SubsetSpec, TaskKind, TaskSpec

ENV_PREFIX = "EVALD_"
DEFAULT_CONFIG = Path("evald.toml")
_ENV_SECTIONS = ("database", "inference", "scheduling", "daemon", "alerts", "web", "executor")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseConfig(_Section):
    url: str = Field(default="sqlite:///evald.db", validate_default=True)
    #: How long the daemon keeps trying to reach the database at start before it exits non-zero (and
    #: its supervisor starts it again). Once running, it waits out any outage, however long.
    start_timeout_secs: float = Field(default=60.0, ge=0)
    #: The longest wait between two tries while the database is away (the waits double up to it).
    retry_max_secs: float = Field(default=5.0, gt=0)

    @field_validator("url")
    @classmethod
    def _relative_sqlite(cls, url: str, info: ValidationInfo) -> str:
        # A relative SQLite path means "beside the config", not "wherever systemd's cwd is".
        prefix = "sqlite:///"
        if url.startswith(prefix) and not url.startswith(prefix + "/") and url != prefix + ":memory:":
            return prefix + str((base_dir(info) / url[len(prefix) :]).resolve())
        return url


Backlog = Literal["newest_first", "oldest_first", "newest_only"]


class AdaptiveConfig(_Section):
    """Evaluate more often while ``metric`` of ``task`` moves by more than its noise, less on a plateau."""

    task: str
    metric: str = "accuracy"
    min_every_steps: int = Field(ge=1)
    max_every_steps: int = Field(ge=1)
    #: A change counts as movement when it exceeds this many combined standard errors.
    noise_sigmas: float = Field(default=2.0, gt=0)

    @model_validator(mode="after")
    def _bounds(self) -> AdaptiveConfig:
        if self.min_every_steps > self.max_every_steps:
            raise ValueError(
                f"min_every_steps ({self.min_every_steps}) is larger than max_every_steps "
                f"({self.max_every_steps})"
            )
        return self


class RunConfig(_Section):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    root: Path
    #: "auto" detects each checkpoint's layout; or one of :data:`inference.layouts.REGISTRY`.
    layout: str = "auto"
    #: A file the trainer writes last; when set, a checkpoint is ready as soon as it exists.
    marker: str | None = None
    #: Folder with the HF config.json (and tokenizer) for checkpoints that hold only tensors
    #: (DeepSpeed engine, DCP).
    hf_config: Path | None = None
    #: "inotify" adds filesystem events to the periodic rescan; "poll" relies on the rescan alone, for
    #: filesystems whose writes by other hosts inotify does not see; "auto" polls on network filesystems
    #: (NFS, Lustre, GPFS, ...) and uses inotify elsewhere.
    watch_mode: Literal["auto", "inotify", "poll"] = "auto"
    #: Task names to evaluate for this run; empty means every task.
    tasks: tuple[str, ...] = ()
    #: How often to evaluate; unset fields take ``[scheduling]``'s (see :class:`SchedulingConfig`).
    freq_steps: int | None = Field(default=None, ge=1)
    freq_epochs: int | None = Field(default=None, ge=1)
    freq_secs: float | None = Field(default=None, gt=0)
    backlog: Backlog | None = None
    #: Turns steps into epochs for checkpoints whose folder names carry only a step.
    steps_per_epoch: int | None = Field(default=None, ge=1)
    #: Evaluate ``base_model`` as step 0 before the first checkpoint.
    eval_before_train: bool = False
    base_model: Path | None = None
    #: The run's last step: the checkpoint that reaches it is final (two-stage: gets its full stage).
    final_step: int | None = Field(default=None, ge=0)
    adaptive: AdaptiveConfig | None = None
    #: One step saved in several shapes is evaluated once, in the first of these shapes that is there:
    #: "hf_export" (save_pretrained weights, what users deploy) before "resumable" (engine shards, DCP);
    #: the others are recorded as its alternates.
    prefer: tuple[layouts.Shape, ...] = Field(
        default=(layouts.Shape.HF_EXPORT, layouts.Shape.RESUMABLE), min_length=1
    )

    @field_validator("root")
    @classmethod
    def _root(cls, value: Path, info: ValidationInfo) -> Path:
        try:
            root = resolve_path(value, info)
        except RuntimeError:
            # Path.resolve on 3.11 raises this on a symlink loop: kept unresolved for _root_readable to name.
            root = base_dir(info) / value.expanduser()
        if root.exists() and not root.is_dir():
            raise ValueError(f"not a directory: {root}")
        return root

    @field_validator("layout")
    @classmethod
    def _layout(cls, value: str) -> str:
        if value != "auto" and value not in layouts.REGISTRY:
            raise ValueError(f"unknown layout {value!r} (known: auto, {', '.join(layouts.REGISTRY)})")
        return value

    @field_validator("hf_config")
    @classmethod
    def _hf_config(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        folder = resolve_path(value, info)
        if not (folder / "config.json").is_file():
            raise ValueError(f"no config.json in {folder}")
        return folder

    @field_validator("base_model")
    @classmethod
    def _base_model(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        folder = resolve_path(value, info)
        if not folder.is_dir():
            raise ValueError(f"not a directory: {folder}")
        return folder

    @model_validator(mode="after")
    def _before_train(self) -> RunConfig:
        if self.eval_before_train and self.base_model is None:
            raise ValueError("eval_before_train needs base_model (the model the run starts from)")
        return self

    @model_validator(mode="after")
    def _root_readable(self) -> RunConfig:
        """A root that does not exist yet is fine (the trainer creates it); one that is a symlink loop or
        cannot be looked at is not: ``exists()`` says False for both, and the run would watch nothing."""
        try:
            self.root.stat()
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                what = "is a symlink loop" if exc.errno == errno.ELOOP else "cannot be read"
                raise ValueError(
                    f"run {self.name!r}: root {self.root} {what} ({exc.strerror}); fix the link or the path"
                ) from None
        return self

    def layout_settings(self) -> layouts.LayoutSettings:
        return layouts.LayoutSettings(
            marker=self.marker, hf_config=self.hf_config, base_model=self.base_model
        )


#: Task settings that only an lm_eval task takes, and those it does not (its YAML defines them).
_HARNESS_FIELDS = frozenset({"lm_eval_task", "lm_eval_include_path", "num_fewshot", "add_bos_token"})
_NOT_HARNESS_FIELDS = frozenset(
    {
        "dataset",
        "prompt_field",
        "answer_field",
        "id_field",
        "text_field",
        "max_length",
        "prompt_template",
        "chat_template",
        "system_prompt",
        "max_new_tokens",
        "n_samples",
        "temperature",
        "top_p",
        "stop",
        "subset",
        "reward",
        "reward_timeout_s",
        "metrics",
    }
)


class TaskConfig(_Section):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    #: ``generate``: answers to prompts, graded against references; ``likelihood``: perplexity of texts;
    #: ``lm_eval``: an lm-evaluation-harness task, run by lm-eval on the loaded model.
    kind: TaskKind = "generate"
    #: The JSONL file (generate and likelihood tasks; an lm_eval task's YAML names its own data).
    dataset: Path | None = None
    prompt_field: str | None = None
    answer_field: str = "answer"
    id_field: str | None = None
    #: Likelihood tasks: the field holding the text, and the tokens kept of a longer one.
    text_field: str = "text"
    max_length: int = Field(default=2048, ge=2)
    prompt_template: str = "{prompt}"
    #: Wrap each prompt in the tokenizer's chat template, after ``system_prompt`` if set.
    chat_template: bool = False
    system_prompt: str | None = None
    max_new_tokens: int = Field(default=32, ge=1, le=65536)
    batch_size: int = Field(default=16, ge=1)
    #: Completions per prompt; more than one needs temperature > 0.
    n_samples: int = Field(default=1, ge=1)
    #: 0 decodes greedily.
    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    #: A response ends at the first of these strings.
    stop: tuple[str, ...] = ()
    limit: int | None = Field(default=None, ge=1)
    #: Evaluate a fixed, seeded, stratified subset of the rows: the same items at every checkpoint.
    subset: SubsetSpec | None = None
    #: ``module:function(prompt, response, reference) -> float``; unset, reward metrics use the built-in
    #: math reward (1 for a correct answer, else 0).
    reward: str | None = Field(default=None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    #: One reward call taking longer is stopped, and its sample reported.
    reward_timeout_s: float = Field(default=10.0, gt=0)
    #: Defaults by kind: see ``inference.metrics.DEFAULT_METRICS``.
    metrics: tuple[str, ...] = ()
    #: ``kind = "lm_eval"``: the task, group or tag name lm-eval knows; a folder of the user's task YAMLs
    #: (relative data_files resolve against it); few-shot examples (unset: the task's own); HFLM's
    #: add_bos_token (unset: lm-eval's default). ``batch_size`` and ``limit`` apply too.
    lm_eval_task: str | None = Field(default=None, min_length=1)
    lm_eval_include_path: Path | None = None
    num_fewshot: int | None = Field(default=None, ge=0)
    add_bos_token: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_metrics(cls, data: Any) -> Any:
        if isinstance(data, dict) and "metrics" not in data:
            kind = data.get("kind", "generate")
            return {**data, "metrics": DEFAULT_METRICS.get(kind, DEFAULT_METRICS["generate"])}
        return data

    @model_validator(mode="after")
    def _sampling(self) -> TaskConfig:
        if self.n_samples > 1 and self.temperature == 0:
            raise ValueError(
                f"n_samples = {self.n_samples} draws identical greedy answers: set temperature > 0"
            )
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError("system_prompt: only used with chat_template = true")
        if self.kind == "lm_eval":
            self._check_lm_eval()
            return self
        harness_only = sorted(_HARNESS_FIELDS & self.model_fields_set)
        if harness_only:
            raise ValueError(f'{", ".join(harness_only)}: only for kind = "lm_eval" tasks')
        if self.dataset is None:
            raise ValueError(f'dataset: a {self.kind} task needs a JSONL file (dataset = "FILE.jsonl")')
        if self.kind == "likelihood":
            generate_only = [
                name
                for name, value in (
                    ("reward", self.reward),
                    ("chat_template", self.chat_template or None),
                    ("n_samples", self.n_samples if self.n_samples > 1 else None),
                )
                if value is not None
            ]
            if generate_only:
                raise ValueError(f'{", ".join(generate_only)}: only for kind = "generate" tasks')
        try:
            resolve_metrics(self.metrics, kind=self.kind, n_samples=self.n_samples)
        except TaskInvalid as exc:
            raise ValueError(f"metrics: {exc.message}") from exc
        return self

    def _check_lm_eval(self) -> None:
        from inference.harness.catalog import check_task

        foreign = sorted(f for f in self.model_fields_set & _NOT_HARNESS_FIELDS if f != "metrics")
        if self.metrics:
            foreign.append("metrics")
        if foreign:
            raise ValueError(
                f'{", ".join(foreign)}: not for kind = "lm_eval" tasks (the lm-eval task\'s YAML defines its '
                "data, prompts and metrics; every metric lm-eval reports is stored)"
            )
        if self.lm_eval_task is None:
            raise ValueError('lm_eval_task: kind = "lm_eval" needs the lm-eval task to run (e.g. "gsm8k")')
        try:
            check_task(self.lm_eval_task, self.lm_eval_include_path)
        except TaskInvalid as exc:
            raise ValueError(f"lm_eval_task: {exc.message}") from exc

    @field_validator("lm_eval_include_path")
    @classmethod
    def _include_path(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = resolve_path(value, info)
        if not path.is_dir():
            raise ValueError(f"folder not found: {path}")
        return path

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = resolve_path(value, info)
        if not path.is_file():
            raise ValueError(f"file not found: {path}")
        return path

    @field_validator("prompt_template")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            value.format(prompt="")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"must be a format string whose only placeholder is {{prompt}} ({exc!r})"
            ) from exc
        return value

    def spec(self, stage_subset: SubsetSpec | None = None) -> TaskSpec:
        return TaskSpec(
            name=self.name,
            kind=self.kind,
            dataset=self.dataset,
            prompt_field=self.prompt_field,
            answer_field=self.answer_field,
            id_field=self.id_field,
            text_field=self.text_field,
            max_length=self.max_length,
            prompt_template=self.prompt_template,
            chat_template=self.chat_template,
            system_prompt=self.system_prompt,
            reward=self.reward,
            reward_timeout_s=self.reward_timeout_s,
            max_new_tokens=self.max_new_tokens,
            batch_size=self.batch_size,
            n_samples=self.n_samples,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stop,
            limit=self.limit,
            metrics=self.metrics,
            subset=self.subset,
            stage_subset=stage_subset,
            lm_eval=None
            if self.lm_eval_task is None
            else HarnessSpec(
                task=self.lm_eval_task,
                include_path=self.lm_eval_include_path,
                num_fewshot=self.num_fewshot,
                add_bos_token=self.add_bos_token,
            ),
        )


class TwoStageConfig(_Section):
    """A quick stage on a fixed subset at every due checkpoint, the full set only now and then."""

    quick_size: int = Field(ge=1)
    #: Dataset field to stratify the quick subset by (difficulty level, subject, ...).
    stratify_field: str | None = None
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


class ResourcesConfig(_Section):
    """What the evaluation node must have free before a job starts; unset means not checked."""

    #: Free memory on every GPU the job uses, with a unit: ``"20GiB"``.
    min_gpu_free_memory: int | None = None
    #: Utilisation of every GPU the job uses, in percent: ``"80%"``.
    max_gpu_utilization: float | None = None
    #: Available host memory, with a unit: ``"8GiB"``.
    min_host_free_memory: int | None = None
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

    def thresholds(self) -> resources.Thresholds:
        return resources.Thresholds(
            min_gpu_free_bytes=self.min_gpu_free_memory,
            max_gpu_utilization_percent=self.max_gpu_utilization,
            min_host_free_bytes=self.min_host_free_memory,
        )


def hostfile_slots(path: Path) -> int:
    """The rank count of a DeepSpeed hostfile (``host slots=N`` per line, ``#`` comments)."""
    total = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("slots=") or not parts[1][6:].isdigit():
            raise ValueError(f"{path}:{number}: expected 'HOST slots=N', got {raw.strip()!r}")
        total += int(parts[1][6:])
    return total


def _worker_env_name(name: str) -> str:
    from daemon.running.environment import refused_extra

    why = refused_extra(name)
    if why is not None:
        raise ValueError(why)
    return name


class InferenceConfig(_Section):
    #: ``deepspeed`` (AutoTP, any tp) or ``hf`` (plain transformers, tp = 1).
    engine: Engine = "deepspeed"
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    threads: int | None = Field(default=None, ge=1)
    #: Tensor-parallel ranks per replica and data-parallel replicas: each job runs tp × dp ranks.
    tp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    #: DeepSpeed hostfile for a worker group across several nodes; unset, the group runs on this node.
    hostfile: Path | None = None
    #: Extra arguments for the launcher of a worker group (torchrun, or DeepSpeed's with a hostfile),
    #: e.g. ``["--master_addr", "10.0.0.1"]``.
    launcher_args: tuple[str, ...] = ()
    #: Interpreter that runs workers; defaults to the daemon's own.
    python: Path | None = None
    #: Environment variables a worker inherits beyond those it needs (daemon/running/environment.py
    #: lists them: PATH, HOME, CUDA_*, HF_*, ...), e.g. a reward function's settings.
    worker_env: tuple[Annotated[str, AfterValidator(_worker_env_name)], ...] = ()
    #: A worker still running after this long is killed and its job failed.
    job_timeout_secs: float = Field(default=3600.0, gt=0)
    #: A job whose worker crashes or times out is tried this many times in all before it stays failed.
    max_attempts: int = Field(default=3, ge=1)
    seed: int = 0
    #: Per-sample outputs stored per job (the first ones); the rest are only aggregated.
    max_samples: int = Field(default=1000, ge=0)
    #: Longest prompt, response or answer text stored per sample; longer text is cut and marked.
    max_text_chars: int = Field(default=2000, ge=16)

    @field_validator("hostfile")
    @classmethod
    def _hostfile(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = resolve_path(value, info)
        if not path.is_file():
            raise ValueError(f"file not found: {path}")
        return path

    @model_validator(mode="after")
    def _layout(self) -> InferenceConfig:
        if self.engine == "hf" and self.tp > 1:
            raise ValueError(f"engine 'hf' cannot shard a model (tp = {self.tp}): use engine = \"deepspeed\"")
        if self.hostfile is not None and self.tp * self.dp > 1:
            slots = hostfile_slots(self.hostfile)
            if slots != self.tp * self.dp:
                raise ValueError(
                    f"hostfile {self.hostfile} has {slots} slots but tp × dp = {self.tp * self.dp}: "
                    "DeepSpeed's launcher starts one rank per slot"
                )
        return self

    def spec(self) -> InferenceSpec:
        return InferenceSpec(
            engine=self.engine,
            device=self.device,
            dtype=self.dtype,
            threads=self.threads,
            tp=self.tp,
            dp=self.dp,
        )


class SchedulingConfig(_Section):
    #: A checkpoint must stay unchanged this long before it is read (ignored when a marker is set).
    quiet_secs: float = Field(default=5.0, ge=0)
    #: A checkpoint still incomplete after this long unchanged is marked invalid.
    invalid_after_secs: float = Field(default=300.0, gt=0)
    #: The periodic full rescan, the safety net under filesystem events.
    rescan_secs: float = Field(default=30.0, gt=0)
    #: How often the main loop wakes when nothing happens.
    tick_secs: float = Field(default=0.2, gt=0, le=10)
    max_concurrent: int = Field(default=1, ge=1)
    #: A running job whose heartbeat is older than this is taken to be orphaned (PostgreSQL).
    lease_secs: float = Field(default=120.0, gt=0)
    heartbeat_secs: float = Field(default=10.0, gt=0)
    #: How often a daemon on PostgreSQL looks for orphaned jobs: another daemon's job is taken over at
    #: most this long after its lease ran out.
    recover_secs: float = Field(default=5.0, gt=0)
    #: On SIGTERM, how long a running job may finish before it is requeued.
    shutdown_grace_secs: float = Field(default=20.0, ge=0)
    #: Default frequency for every run (a run's own fields win). A checkpoint is due when ANY set trigger
    #: fires; with none set, every checkpoint is due.
    freq_steps: int | None = Field(default=None, ge=1)
    freq_epochs: int | None = Field(default=None, ge=1)
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

    def frequency_for(self, run: RunConfig) -> frequency.Frequency:
        """The run's own triggers, each unset one taken from ``[scheduling]``."""
        return frequency.Frequency(
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


class DaemonConfig(_Section):
    #: Where job specs, results and worker logs are kept.
    state_dir: Path = Field(default=Path("state"), validate_default=True)
    #: Logs as JSON ("json"), human-readable ("console"), or JSON unless stdout is a terminal ("auto").
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, value: Path, info: ValidationInfo) -> Path:
        return resolve_path(value, info)


Direction = Literal["higher", "lower", "none"]


class ThresholdConfig(_Section):
    """An absolute bound on a metric: crossing it is a critical alert whatever the series did before."""

    min: float | None = None
    max: float | None = None


class AlertsConfig(_Section):
    #: A repeat of a firing alert within this long updates it without sending it again.
    cooldown_secs: float = Field(default=3600.0, ge=0)
    #: Where a status JSON per run is written (best checkpoint, firing alerts, where to roll back to).
    feedback_dir: Path | None = None
    #: The metric that picks a run's best checkpoint.
    best_metric: str = "accuracy"
    #: Which way is better, per metric, overriding the registry's (``none``: any jump counts).
    directions: dict[str, Direction] = Field(default_factory=dict)
    thresholds: dict[str, ThresholdConfig] = Field(default_factory=dict)
    #: Detector settings (``daemon.anomaly.settings.Settings``): window, z_threshold, noise_sigmas, ...
    detectors: dict[str, float] = Field(default_factory=dict)
    #: Links sent with every alert, e.g. ``{ dashboard = "https://grafana/d/evald" }``.
    links: dict[str, str] = Field(default_factory=dict)

    @field_validator("feedback_dir")
    @classmethod
    def _feedback_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else resolve_path(value, info)

    @field_validator("links")
    @classmethod
    def _links(cls, value: dict[str, str]) -> dict[str, str]:
        empty = sorted(name for name, url in value.items() if not name or not url.strip())
        if empty:
            raise ValueError(f"empty link {', '.join(empty)}: give each a URL")
        return value

    @model_validator(mode="after")
    def _ranges(self) -> AlertsConfig:
        problems = [
            f"thresholds.{m}: min > max"
            for m, t in self.thresholds.items()
            if t.min is not None and t.max is not None and t.min > t.max
        ]
        s = self.settings()
        if s.window < 2 or s.min_history < 2:
            problems.append("detectors: window and min_history must be at least 2")
        if not 0 < s.ewma_lambda <= 1:
            problems.append("detectors: ewma_lambda must be in (0, 1]")
        for name in ("z_threshold", "noise_sigmas", "cusum_h", "drop_sigmas", "length_ratio"):
            if getattr(s, name) <= 0:
                problems.append(f"detectors: {name} must be positive")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @field_validator("detectors")
    @classmethod
    def _detectors(cls, value: dict[str, float]) -> dict[str, float]:
        from daemon.anomaly.settings import Settings

        known = set(Settings.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"unknown detector setting {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        return value

    def settings(self) -> Any:
        from daemon.anomaly.settings import Settings

        defaults = Settings()
        return Settings(**{k: type(getattr(defaults, k))(v) for k, v in self.detectors.items()})


class WebhookConfig(_Section):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    url: str = Field(pattern=r"^https?://\S+$")
    format: Literal["generic", "slack", "alertmanager"] = "generic"
    #: The signing secret (Standard Webhooks, ``whsec_...``): from this environment variable or file.
    secret_env: str | None = None
    secret_file: Path | None = None
    connect_timeout_secs: float = Field(default=2.0, gt=0)
    #: The whole request, connect to last byte: a receiver that hangs is cut off here.
    timeout_secs: float = Field(default=5.0, gt=0)
    min_severity: Literal["info", "warning", "critical"] = "warning"
    #: Retries back off exponentially (with jitter) up to this; a message is retried until delivered.
    max_backoff_secs: float = Field(default=300.0, gt=0)

    @field_validator("secret_file")
    @classmethod
    def _secret_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else resolve_path(value, info)

    @model_validator(mode="after")
    def _secret_usable(self, info: ValidationInfo) -> WebhookConfig:
        """The secret read as ``evald run`` reads it, so ``config check`` and a reload refuse what a start
        would, in the same words. One that is not there at all (a variable or credential file only the
        daemon's unit provides) is left to the start: see :meth:`secret_absent`."""
        environ = (info.context or {}).get("environ")
        unsigned = self.secret_env is None and self.secret_file is None
        if unsigned or environ is None or self.secret_absent(environ) is not None:
            return self
        from daemon.alerts.errors import SecretError
        from daemon.alerts.signing import load_secret

        try:
            load_secret(env=self.secret_env, file=self.secret_file, environ=environ)
        except SecretError as exc:
            raise ValueError(str(exc)) from None
        return self

    def secret_absent(self, environ: Mapping[str, str]) -> str | None:
        """Why this host cannot read the secret at all (its variable unset, its file missing), else None."""
        if self.secret_env is not None and self.secret_file is None and self.secret_env not in environ:
            return f"environment variable {self.secret_env} is not set here"
        if self.secret_file is not None and self.secret_env is None and not os.path.lexists(self.secret_file):
            return f"secret file {self.secret_file} does not exist here"
        return None


class WebConfig(_Section):
    """``evald serve``: the read-only HTTP API, dashboard and ``/metrics``."""

    #: Loopback by default: put a reverse proxy (TLS) in front to reach it from elsewhere.
    host: str = Field(default="127.0.0.1", min_length=1)
    port: int = Field(default=8321, ge=1, le=65535)
    #: When set, every request must carry ``Authorization: Bearer <token>``, the token read from this
    #: environment variable at start (never from the file, never logged).
    token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: Serve a non-loopback ``host`` without a token anyway (prompts, responses and paths open to whoever
    #: reaches the port); ``evald serve --insecure-no-token`` is the same for one start.
    allow_open: bool = False
    #: ``/metrics`` lists the configured runs and any other whose newest result is at most this old, so
    #: the ``run`` label does not grow with every run the database keeps; 0: configured runs only.
    metrics_window_secs: float = Field(default=7 * 86400.0, ge=0, allow_inf_nan=False)

    def token(self, environ: Mapping[str, str]) -> str | None:
        """The bearer token, or None when none is required; a named but unset variable is an error."""
        if self.token_env is None:
            return None
        value = environ.get(self.token_env, "").strip()
        if not value:
            raise ConfigError(
                "web.token_env",
                [f"environment variable {self.token_env} is not set or empty (set it, or remove token_env)"],
            )
        return value


class Config(_Section):
    database: DatabaseConfig = DatabaseConfig()
    runs: tuple[RunConfig, ...]
    tasks: tuple[TaskConfig, ...]
    inference: InferenceConfig = InferenceConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    daemon: DaemonConfig = DaemonConfig()
    alerts: AlertsConfig = AlertsConfig()
    webhooks: tuple[WebhookConfig, ...] = ()
    trackers: tuple[TrackerConfig, ...] = ()
    web: WebConfig = WebConfig()
    #: Where evaluations run: on this node (``local``, the default) or through Slurm.
    executor: ExecutorConfig = ExecutorConfig()

    @model_validator(mode="before")
    @classmethod
    def _sections(cls, data: Any) -> Any:
        # An absent section is validated like an empty one, so its defaults see the config's folder.
        if isinstance(data, dict):
            return {**{name: {} for name in _ENV_SECTIONS}, **data}
        return data

    @model_validator(mode="after")
    def _cross_references(self) -> Config:
        problems: list[str] = []
        for kind, items in (("runs", self.runs), ("tasks", self.tasks)):
            if not items:
                problems.append(f"{kind}: at least one is needed ([[{kind}]] tables)")
        groups = (
            ("runs", [r.name for r in self.runs]),
            ("tasks", [t.name for t in self.tasks]),
            ("webhooks", [w.name for w in self.webhooks]),
        )
        for kind, names in groups:
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                problems.append(f"{kind}: duplicate name {', '.join(dupes)}")
        known = {t.name for t in self.tasks}
        for i, run in enumerate(self.runs):
            for j, task in enumerate(run.tasks):
                if task not in known:
                    problems.append(
                        f"runs[{i}].tasks[{j}]: unknown task {task!r} (defined: {', '.join(sorted(known))})"
                    )
        for name, stages in self.scheduling.two_stage.items():
            staged = self.task(name)
            if staged is None:
                problems.append(
                    f"scheduling.two_stage.{name}: unknown task {name!r} "
                    f"(defined: {', '.join(sorted(known))})"
                )
            elif stages.watch_metric not in staged.metrics:
                problems.append(
                    f"scheduling.two_stage.{name}.watch_metric: task {name!r} does not compute "
                    f"{stages.watch_metric!r} (its metrics: {', '.join(staged.metrics)})"
                )
        for i, run in enumerate(self.runs):
            if run.adaptive is not None:
                problems.extend(self._adaptive_problems(f"runs[{i}].adaptive", run))
        secrets = (
            {self.web.token_env: "web.token_env"}
            | {w.secret_env: f"webhooks[{j}].secret_env" for j, w in enumerate(self.webhooks) if w.secret_env}
            | {t.token_env: f"trackers[{j}].token_env" for j, t in enumerate(self.trackers) if t.token_env}
        )
        problems.extend(tracker_problems(self.trackers, {r.name for r in self.runs}))
        for i, name in enumerate(self.inference.worker_env):
            if name in secrets:
                problems.append(
                    f"inference.worker_env[{i}]: {name} holds the daemon's secret ({secrets[name]}): "
                    "a worker must not inherit it"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _adaptive_problems(self, where: str, run: RunConfig) -> list[str]:
        assert run.adaptive is not None
        names = [t.name for t in self.tasks_for(run)]
        task = self.task(run.adaptive.task)
        if task is None or task.name not in names:
            return [
                f"{where}.task: {run.adaptive.task!r} is not a task of this run "
                f"(its tasks: {', '.join(names)})"
            ]
        if run.adaptive.metric not in task.metrics:
            return [
                f"{where}.metric: task {task.name!r} does not compute {run.adaptive.metric!r} "
                f"(its metrics: {', '.join(task.metrics)})"
            ]
        return []

    def tasks_for(self, run: RunConfig) -> tuple[TaskConfig, ...]:
        return tuple(t for t in self.tasks if not run.tasks or t.name in run.tasks)

    def task(self, name: str) -> TaskConfig | None:
        return next((t for t in self.tasks if t.name == name), None)

    def run(self, name: str) -> RunConfig | None:
        return next((r for r in self.runs if r.name == name), None)


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _message(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    message = str(error.get("msg", "invalid"))
    return message.removeprefix("Value error, ")


def format_errors(exc: ValidationError) -> list[str]:
    problems = []
    for error in exc.errors():
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # Model-level validators report several problems in one message, each already with its path.
        if error["type"] == "value_error" and not loc:
            problems.extend(_message(error).split("; "))
            continue
        problems.append(f"{_location(loc)}: {_message(error)}")
    return problems


def env_overrides() -> dict[str, tuple[str, str]]:
    """Every ``EVALD_<SECTION>_<FIELD>`` variable name, with the (section, field) it sets."""
    names: dict[str, tuple[str, str]] = {}
    for section in _ENV_SECTIONS:
        model: type[BaseModel] = Config.model_fields[section].annotation  # type: ignore[assignment]
        for field in model.model_fields:
            names[f"{ENV_PREFIX}{section}_{field}".upper()] = (section, field)
    return names


def apply_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Overlay ``EVALD_<SECTION>_<FIELD>`` variables on the parsed file."""
    merged = dict(data)
    for name, (section, field) in env_overrides().items():
        value = environ.get(name)
        if value is not None:
            merged[section] = {**merged.get(section, {}), field: value}
    return merged


def parse_config(
    data: dict[str, Any], *, base_dir: Path, source: str, environ: Mapping[str, str] | None = None
) -> Config:
    environ = os.environ if environ is None else environ
    try:
        return Config.model_validate(
            apply_env(data, environ), context={"base_dir": base_dir, "environ": environ}
        )
    except ValidationError as exc:
        raise ConfigError(source, format_errors(exc)) from exc


def config_path(explicit: str | None, environ: Mapping[str, str] | None = None) -> Path:
    """``--config``, else ``$EVALD_CONFIG``, else ``./evald.toml``."""
    env = os.environ if environ is None else environ
    return Path(explicit or env.get(f"{ENV_PREFIX}CONFIG") or DEFAULT_CONFIG)


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> Config:
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise ConfigError(source, ["file not found (pass --config or set EVALD_CONFIG)"]) from exc
    except OSError as exc:
        raise ConfigError(source, [f"cannot read: {exc.strerror}"]) from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"not UTF-8 text ({exc.reason} at byte {exc.start})"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"not valid TOML: {exc}"]) from exc
    return parse_config(data, base_dir=path.resolve().parent, source=source, environ=environ)
