"""``[[trackers]]``: where results go besides evald's own database (MLflow, W&B, TensorBoard event files).

Secrets are named by environment variable only: the file never holds one, and the value is read by the
sink at delivery, never logged nor given to a worker.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from daemon.config.base import Section, resolve_path

Kind = Literal["mlflow", "wandb", "tensorboard"]

#: The import each kind needs, and the extra that installs it.
LIBRARIES: dict[str, tuple[str, str]] = {
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
    # torch's SummaryWriter needs the tensorboard package, a core dependency: always there.
    "tensorboard": ("tensorboard", "tensorboard"),
}

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def library_missing(kind: str) -> str | None:
    """Why ``kind`` cannot be used here (its library is not installed), or None."""
    module, extra = LIBRARIES[kind]
    if importlib.util.find_spec(module) is None:
        return f"kind = {kind!r} needs the {module} package: pip install 'evald[{extra}]'"
    return None


#: A tracker's outbox rows have endpoint ``tracker:<name>``; a webhook's its plain name.
ENDPOINT_PREFIX = "tracker:"


class TrackerConfig(Section):
    #: Where the results go: ``mlflow`` (a tracking server or a local store), ``wandb`` (Weights &
    #: Biases, online or offline), ``tensorboard`` (event files). Its library is an optional extra.
    kind: Kind
    #: The outbox endpoint is ``tracker:<name>``; defaults to the kind (two of one kind need names).
    name: str = Field(default="", max_length=100, pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]*$")
    #: MLflow: the tracking server (``http://host:5000``, or a local ``sqlite:///`` / ``file:`` store).
    #: W&B: the server's base URL (None: W&B's own, or offline).
    tracking_uri: str | None = None
    #: MLflow: the experiment an own run is created in, and where the trainer's run is searched for
    #: (``attach = "trainer"``); a trainer's run found otherwise keeps its own experiment.
    experiment: str = Field(default="evald", min_length=1)
    #: W&B: ``entity/project`` or ``project``.
    project: str | None = None
    #: W&B: ``online`` or ``offline`` (the run's files under ``dir``, sent later by ``wandb sync``).
    mode: Literal["online", "offline"] = "online"
    #: W&B's files (offline runs), TensorBoard's event files: one folder per evald run below it.
    #: None: W&B's default; TensorBoard: ``<run root>/evald_tensorboard``.
    dir: Path | None = None
    #: ``trainer``: log into the trainer's own run where it is found (W&B: ``run_ids``, else the
    #: ``wandb/latest-run`` link under the run root; MLflow: ``run_ids``, else the id in
    #: ``<run root>/mlflow_run_id``, else the newest run of a local store under the run root
    #: (``mlflow.db``, ``mlruns/``), else the tracking server's search in ``experiment``, by
    #: ``trainer_run_name`` and ``trainer_tags`` or, without them, by HF Trainer's ``output_dir``
    #: parameter), else an own run; ``own``: always one run per evald run, named after it.
    attach: Literal["trainer", "own"] = "trainer"
    #: The trainer's run id by evald run name (an MLflow run id, a W&B run id), for a trainer that
    #: leaves none beside its checkpoints; checked to exist, else an own run (and a log line).
    run_ids: dict[str, str] = Field(default_factory=dict)
    #: MLflow: the trainer's run name, searched for in ``experiment`` (HF Trainer: ``run_name``; verl:
    #: ``trainer.experiment_name``, its ``project_name`` being the experiment); ``{run}`` stands for the
    #: evald run's name. The newest active run of that name (and ``trainer_tags``) is attached.
    trainer_run_name: str | None = Field(default=None, min_length=1, max_length=250)
    #: MLflow: tags the trainer's run has (HF Trainer: the JSON of ``MLFLOW_TAGS``), searched for in
    #: ``experiment`` with ``trainer_run_name``.
    trainer_tags: dict[str, str] = Field(default_factory=dict)
    #: The API key (W&B) or bearer token (MLflow): the NAME of the environment variable holding it.
    token_env: str | None = Field(default=None, pattern=_ENV_NAME)
    #: MLflow basic auth (``mlflow server --app-name basic-auth``): the NAME of the variable holding the
    #: user name; ``token_env`` then names the password's.
    user_env: str | None = Field(default=None, pattern=_ENV_NAME)
    #: Which evald runs go there (empty: all).
    runs: tuple[str, ...] = ()
    #: Graded samples per evaluation in the sample table (W&B Table, MLflow table artifact); 0: none.
    samples: int = Field(default=16, ge=0, le=1000)
    #: Retries back off exponentially (with jitter) up to this; a message is retried until delivered.
    max_backoff_secs: float = Field(default=300.0, gt=0)
    #: A refused credential pauses the sink this long before it tries again (evaluation goes on; nothing
    #: queued is dropped).
    pause_secs: float = Field(default=600.0, gt=0)
    #: One delivery call's limit.
    timeout_secs: float = Field(default=10.0, gt=0)
    #: Messages claimed from the outbox in one transaction and handed to the tracker together (MLflow:
    #: one ``log_batch`` per 100 evaluations; W&B: one ``log`` per step); 1: one message per claim.
    batch: int = Field(default=200, ge=1, le=1000)

    @field_validator("dir")
    @classmethod
    def _dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else resolve_path(value, info)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("name") and isinstance(data.get("kind"), str):
            return {**data, "name": data["kind"]}
        return data

    @model_validator(mode="after")
    def _per_kind(self) -> TrackerConfig:
        missing = library_missing(self.kind)
        if missing is not None:
            raise ValueError(missing)
        if self.kind == "mlflow" and not self.tracking_uri:
            raise ValueError("kind = 'mlflow' needs tracking_uri (http://host:5000, or sqlite:///path.db)")
        if self.user_env is not None and (self.kind != "mlflow" or self.token_env is None):
            raise ValueError("user_env is MLflow's basic auth: it needs kind = 'mlflow' and token_env")
        if self.kind != "mlflow" and (self.trainer_run_name is not None or self.trainer_tags):
            raise ValueError(
                "trainer_run_name and trainer_tags find an MLflow run: they need kind = 'mlflow'"
            )
        if self.kind == "wandb" and not self.project:
            raise ValueError("kind = 'wandb' needs project ('entity/project' or 'project')")
        if self.kind == "wandb" and self.project is not None and self.project.count("/") > 1:
            raise ValueError(f"project {self.project!r}: 'entity/project' or 'project'")
        return self

    @property
    def endpoint(self) -> str:
        """The outbox's endpoint name for this tracker (webhooks have plain names: no clash)."""
        return f"{ENDPOINT_PREFIX}{self.name}"

    @property
    def where(self) -> str:
        """Where the data goes, in the settings that decide it (what ``target`` is made of)."""
        if self.kind == "mlflow":
            uri = (self.tracking_uri or "").rstrip("/")
            return f"MLflow {uri} experiment {self.experiment!r} (attach = {self.attach!r})"
        if self.kind == "wandb":
            server = (self.tracking_uri or "https://api.wandb.ai").rstrip("/")
            return f"W&B {server} project {self.project!r} (attach = {self.attach!r})"
        folder = str(self.dir) if self.dir is not None else "<run root>/evald_tensorboard"
        return f"TensorBoard folder {folder}"

    @property
    def target(self) -> str:
        """A stable key of where the data goes (``where``): what the outbox's delivery records are kept by,
        so a tracker pointed at another server, experiment, project or folder sends its runs' history there
        instead of finding it delivered; timeouts, batches or credentials do not change it."""
        digest = hashlib.sha256(self.where.encode()).hexdigest()[:32]
        return f"{self.kind}:{digest}"

    @property
    def entity(self) -> str | None:
        return self.project.split("/", 1)[0] if self.project and "/" in self.project else None

    @property
    def wandb_project(self) -> str | None:
        return self.project.rsplit("/", 1)[-1] if self.project else None

    def takes(self, run: str) -> bool:
        return not self.runs or run in self.runs


def tracker_problems(trackers: tuple[TrackerConfig, ...], runs: set[str]) -> list[str]:
    """Cross-section checks the top-level config runs: unique names, known runs."""
    problems = []
    names = [t.name for t in trackers]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"trackers: duplicate name {', '.join(dupes)} (give each a name)")
    for i, tracker in enumerate(trackers):
        for j, run in enumerate(tracker.runs):
            if run not in runs:
                problems.append(f"trackers[{i}].runs[{j}]: unknown run {run!r}")
    return problems
