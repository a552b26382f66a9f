"""``[[runs]]``: the training runs watched, where their checkpoints land and how often to evaluate them."""

from __future__ import annotations

import errno
import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from daemon.config.base import Section, base_dir, resolve_path
from daemon.config.object_store import S3Config, is_object_url, split_url
from inference import layouts

Backlog = Literal["newest_first", "oldest_first", "newest_only"]


class AdaptiveConfig(Section):
    """Evaluate more often while ``metric`` of ``task`` moves by more than its noise, less on a plateau."""

    #: The task whose results set the pace: one of this run's tasks.
    task: str
    #: The metric of ``task`` watched (one the task computes).
    metric: str = "accuracy"
    #: The shortest interval, in steps: moving results halve it down to this; the first interval when
    #: ``freq_steps`` is unset.
    min_every_steps: int = Field(ge=1)
    #: The longest interval, in steps: flat results double it up to this.
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


class RunConfig(Section):
    """One training run: the folder its checkpoints appear in, how to read them and which are evaluated."""

    #: The run's name in the database, ``evald status``, alerts and ``/metrics``: its results are kept
    #: under it, so a new name starts a new history.
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    #: The folder the trainer saves this run's checkpoints in (one folder per checkpoint below it); it need
    #: not exist yet. Or ``s3://bucket/prefix`` on an S3-compatible store, reached as ``[runs.s3]`` says:
    #: the prefix is listed, judged from the objects' metadata and a few small reads, and a due
    #: checkpoint is downloaded into ``[runs.s3] cache_dir`` for the worker.
    root: Path
    #: The S3-compatible store of an ``s3://`` root (endpoint, credentials by variable name, local cache).
    s3: S3Config | None = None
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
    #: How often to evaluate: a checkpoint is due once it is this many steps past the last one evaluated
    #: (any set trigger makes it due). Each unset ``freq_*`` takes ``[scheduling]``'s.
    freq_steps: int | None = Field(default=None, ge=1)
    #: Due once its epoch is this many past the last evaluated one's (the epoch comes from the folder name,
    #: or from the step with ``steps_per_epoch``); unset: ``[scheduling]``'s.
    freq_epochs: int | None = Field(default=None, ge=1)
    #: Due once this many seconds have passed since the last evaluation: the newest ready checkpoint is
    #: taken, older waiting ones skipped; unset: ``[scheduling]``'s.
    freq_secs: float | None = Field(default=None, gt=0)
    #: Which due checkpoint runs first when several wait (see ``[scheduling] backlog``); unset:
    #: ``[scheduling]``'s.
    backlog: Backlog | None = None
    #: Turns steps into epochs for checkpoints whose folder names carry only a step.
    steps_per_epoch: int | None = Field(default=None, ge=1)
    #: Evaluate ``base_model`` as step 0 before the first checkpoint.
    eval_before_train: bool = False
    #: Local folder of the model the run starts from: evaluated as step 0 with ``eval_before_train``, and
    #: the model LoRA adapter checkpoints are merged into (unset: the adapter's ``base_model_name_or_path``).
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

    #: The ``s3://`` URL ``root`` was given as (``root`` is then the local mirror of its listing).
    _url: str | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _object_root(
        cls, data: Any, handler: ModelWrapValidatorHandler[RunConfig], info: ValidationInfo
    ) -> RunConfig:
        """An ``s3://`` root is watched through its local mirror (see :class:`S3Config`), which becomes
        ``root``: what discovery judges and what checkpoints are recorded under."""
        if not isinstance(data, dict) or not is_object_url(data.get("root")):
            if isinstance(data, dict) and data.get("s3") is not None:
                raise ValueError("s3 is set but root is not an s3://bucket/prefix URL")
            return handler(data)
        url = str(data["root"])
        split_url(url)  # a ValueError naming what is wrong with it
        if importlib.util.find_spec("boto3") is None:
            raise ValueError(f"root {url}: reading object storage needs boto3: pip install 'evald[s3]'")
        if data.get("watch_mode", "poll") != "poll":
            raise ValueError(
                f'watch_mode {data["watch_mode"]!r}: an s3:// root is listed (watch_mode = "poll")'
            )
        # Validated with the rest (errors keep their path, runs.N.s3.FIELD), then pointed at the mirror.
        config = handler({**data, "root": ".", "s3": data.get("s3") or {}, "watch_mode": "poll"})
        store = config.s3 if config.s3 is not None else S3Config()
        config = config.model_copy(update={"root": store.mirror_root(url), "s3": store})
        config._url = url.rstrip("/")
        return config

    @property
    def url(self) -> str | None:
        """The ``s3://bucket/prefix`` this run's checkpoints are uploaded to; ``None`` for a local root."""
        return self._url

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
