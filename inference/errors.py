"""Inference errors: a worker's input was rejected, and the message says what and where.

Hierarchy::

    EvaldError               evald.errors: the root, shared with the daemon's errors and storage's
    ├── InferenceError       a rejected input: the job fails with its kind, as data
    │   ├── CheckpointInvalid    the checkpoint cannot be loaded (bad config.json, missing or truncated
    │   │   │                    weights)
    │   │   └── FileRefused      a file of it is not read (a FIFO, a 5 GB config.json, JSON nested 10⁵
    │   │       │                deep)
    │   │       └── TreeRefused  inference.layouts.base: a checkpoint's folder tree is not walked (too
    │   │                        many entries, too deep, a link out of it)
    │   ├── CheckpointVanished   the checkpoint directory disappeared while it was being read
    │   ├── DatasetInvalid       a dataset row is unusable (``data.jsonl:17: missing field 'answer'``)
    │   └── TaskInvalid          the task itself is wrong (unknown metric, bad prompt template)
    └── RewardFailed         inference.rewards: one call of a reward function failed; that sample's
                             problem, never the job's (so not an InferenceError)

Each :class:`InferenceError` carries the :data:`inference.spec.ErrorKind` the worker reports for it, so
the daemon can tell a bad input (a failed job, data) from a crash (a traceback).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import ClassVar

from evald.errors import EvaldError
from inference.spec import ErrorKind


class InferenceError(EvaldError):
    """Base of every error raised by :mod:`inference` for a rejected input."""

    kind: ClassVar[ErrorKind]

    @property
    def message(self) -> str:
        return str(self)


class CheckpointInvalid(InferenceError):
    kind: ClassVar[ErrorKind] = "checkpoint_invalid"


class FileRefused(CheckpointInvalid):
    """``path`` is not read (:mod:`inference.layouts.files`); ``problem`` follows its name in a reason."""

    def __init__(self, path: PurePath, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem


class CheckpointVanished(InferenceError):
    kind: ClassVar[ErrorKind] = "checkpoint_vanished"


class DatasetInvalid(InferenceError):
    kind: ClassVar[ErrorKind] = "dataset_invalid"


class TaskInvalid(InferenceError):
    kind: ClassVar[ErrorKind] = "task_invalid"
