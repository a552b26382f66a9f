"""What every checkpoint layout shares: a directory snapshot, a readiness verdict, step parsing.

Readiness rules are pure functions over a :class:`Snapshot` (plus the few small files a rule needs to
read), so they are tested without timing games; the quiet-period clock lives with the caller.
"""

from __future__ import annotations

import enum
import os
import re
import stat
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from inference.errors import FileRefused


class Readiness(enum.StrEnum):
    #: Still being written (or not yet recognisable): look again later.
    INCOMPLETE = "incomplete"
    #: Every file the layout needs is there and whole.
    COMPLETE = "complete"
    #: Whole but wrong (a corrupt header, an index naming a shard that is not there once writing stopped).
    INVALID = "invalid"


class Shape(enum.StrEnum):
    """What kind of save a checkpoint folder is, for choosing one when a step was saved twice."""

    #: ``save_pretrained`` weights (OpenRLHF's ``global_stepN_hf``, AReaL, any HF export): what users deploy.
    HF_EXPORT = "hf_export"
    #: A trainer's resumable state (DeepSpeed engine shards, DCP, an HF Trainer or verl checkpoint).
    RESUMABLE = "resumable"


@dataclass(frozen=True)
class Verdict:
    readiness: Readiness
    reason: str
    #: Invalid whatever comes next (a FIFO, JSON nested too deep): refused at once, not after the quiet
    #: period that lets a half-written file look corrupt for a moment.
    final: bool = False

    @classmethod
    def complete(cls) -> Verdict:
        return cls(Readiness.COMPLETE, "complete")


@dataclass(frozen=True, slots=True)
class FileStat:
    relpath: str
    size: int
    mtime_ns: int
    #: ``stat.S_IFMT`` of the file (a link followed): a FIFO or a device is listed too, so that it is named.
    file_type: int = stat.S_IFREG

    @property
    def special(self) -> bool:
        """A FIFO, socket or device: opening or reading it may block forever, so it is never read."""
        return self.file_type not in (stat.S_IFREG, stat.S_IFDIR)


@dataclass(frozen=True)
class Snapshot:
    """Every file under a checkpoint directory (FIFOs and devices too, to be named), sorted; equal snapshots
    mean nothing changed."""

    files: tuple[FileStat, ...]

    def names(self) -> frozenset[str]:
        return frozenset(f.relpath for f in self.files)

    def special(self) -> tuple[FileStat, ...]:
        """The files no reader may open (:attr:`FileStat.special`), in path order."""
        return tuple(f for f in self.files if f.special)

    def size(self, relpath: str) -> int | None:
        for entry in self.files:
            if entry.relpath == relpath:
                return entry.size
        return None


#: The most entries (files and folders) one checkpoint folder may hold, and how deep its folders may nest.
#: The largest layouts write a few thousand files (a ZeRO-3 or DCP save of 2,048 ranks: two per rank) two
#: levels deep (verl's ``actor/huggingface/``); past these bounds a folder is refused as what no trainer
#: writes, and the listing stops there, so one folder can neither exhaust the daemon's memory nor its stack.
MAX_TREE_ENTRIES = 20_000
MAX_TREE_DEPTH = 12


class TreeRefused(FileRefused):
    """A checkpoint folder past :data:`MAX_TREE_ENTRIES` or :data:`MAX_TREE_DEPTH`: final, whatever comes."""


def take_snapshot(directory: Path) -> Snapshot:
    """Stat every file under ``directory`` without following symlinks out of it (nothing is opened).

    Raises ``FileNotFoundError`` when the directory itself is gone (rotated away), and :class:`TreeRefused`
    past the bounds above (the walk stops there). Entries that vanish or change type while it lists are
    skipped: the next snapshot differs anyway.
    """
    found: list[FileStat] = []
    stack: list[tuple[str, int]] = [(str(directory), 0)]
    entries_seen = 0
    while stack:
        current, depth = stack.pop()
        entries: list[os.DirEntry[str]] = []
        try:
            with os.scandir(current) as listing:
                # Counted as they come: a folder of 200,000 files is refused before it is held whole.
                for entry in listing:
                    entries_seen += 1
                    if entries_seen > MAX_TREE_ENTRIES:
                        raise TreeRefused(
                            directory,
                            f"holds more than {MAX_TREE_ENTRIES:,} files and folders: no checkpoint layout "
                            "writes so many, so it is not read",
                        )
                    entries.append(entry)
        except (FileNotFoundError, NotADirectoryError):
            if current == str(directory):
                raise
            continue  # a sub-folder removed (or swapped for a file) between listing and reading
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 >= MAX_TREE_DEPTH:
                        relpath = os.path.relpath(entry.path, directory)
                        raise TreeRefused(
                            directory,
                            f"nests folders more than {MAX_TREE_DEPTH} deep (at {relpath[:200]!r}): no "
                            "checkpoint layout nests so deep, so it is not read",
                        )
                    stack.append((entry.path, depth + 1))
                    continue
                info = entry.stat(follow_symlinks=True)
            except (FileNotFoundError, NotADirectoryError):
                continue
            relpath = os.path.relpath(entry.path, directory)
            found.append(FileStat(relpath, info.st_size, info.st_mtime_ns, stat.S_IFMT(info.st_mode)))
    return Snapshot(tuple(sorted(found, key=lambda f: f.relpath)))


# A minus sign is read as one (``step_-1`` is step -1, which is then refused, not step 1); after a word
# (``model-5``) it is a separator.
_STEP_PATTERNS = (
    re.compile(r"epoch(?P<epoch>-?\d+)epochstep-?\d+globalstep(?P<step>-?\d+)"),
    re.compile(r"(?:checkpoint|global_step|globalstep|step|iter|iteration|ckpt)[-_]?(?P<step>-?\d+)", re.I),
)
#: Without a step word, only a number that ends the name, alone or after a separator (``300``, ``model-5``,
#: ``step=300``): digits inside a word (``ds2``, ``Qwen2.5-7B-Instruct``, ``qwen2-7b-grpo``) name a model
#: or a save_dir, not a step, and a folder's step must never come from them.
_LAST_NUMBER = re.compile(r"(?:^|(?<=[-_=\s]))(?P<step>(?:(?:^|(?<=[_=\s]))-)?\d+)\Z")

#: The largest step or epoch evald stores: PostgreSQL's ``INTEGER`` (32-bit signed), the type of the
#: ``step`` and ``epoch`` columns. SQLite would take 64 bits, but both backends refuse the same folders.
STEP_MAX = 2**31 - 1


def parse_step(name: str, *, bare_number: bool = True) -> tuple[int | None, int | None]:
    """(step, epoch) from a checkpoint directory name; ``None`` for what the name does not say.

    ``bare_number=False`` takes only a step word (``checkpoint-N``, ``global_stepN``, ``iter_N``, ...): a
    name a layout owns, which makes the folder a checkpoint whatever it holds. A bare trailing number
    (``300``, a DeepSpeed tag) is a step only once the folder's files make it a checkpoint.
    Negative and huge numbers are returned as written: :func:`step_problem` says why they are refused.
    """
    for pattern in _STEP_PATTERNS:
        match = pattern.search(name)
        if match:
            epoch = match.groupdict().get("epoch")
            return int(match["step"]), int(epoch) if epoch is not None else None
    if not bare_number:
        return None, None
    last = _LAST_NUMBER.search(name)
    return (int(last["step"]), None) if last else (None, None)


def step_problem(name: str, step: int | None, epoch: int | None) -> str | None:
    """Why the (step, epoch) read from folder ``name`` cannot be a checkpoint's, or ``None`` (pure).

    A step is a count of optimizer steps, never negative, and must fit the database's column: one that
    does not would make every insert of the batch it is in fail.
    """
    for what, value in (("step", step), ("epoch", epoch)):
        if value is not None and not 0 <= value <= STEP_MAX:
            return f"{what} {value} in folder name {name!r} is out of range (0..{STEP_MAX})"
    return None


def is_ignored_name(name: str) -> bool:
    """Folders trainers use while writing, and hidden ones, are never checkpoints."""
    return name.startswith((".", "tmp-", "tmp_")) or name.endswith((".tmp", ".partial", ".incomplete"))


@dataclass(frozen=True)
class LayoutSettings:
    """What a run's config tells every layout."""

    #: A file the trainer writes last; when set, the daemon waits for it instead of a quiet period.
    marker: str | None = None
    #: A folder with the HF ``config.json`` (and tokenizer files) for checkpoints that hold only tensors
    #: (DeepSpeed engine, DCP); unset, it is looked for beside the checkpoint (``model_config``).
    hf_config: Path | None = None
    #: The run's ``root``: how far up from a checkpoint its ``config.json`` is looked for.
    run_root: Path | None = None
    #: ``runs[].base_model``: the model a LoRA adapter is merged into (``lora``).
    base_model: Path | None = None


class Layout(ABC):
    """One way trainers lay a checkpoint out on disk.

    A layout recognises its checkpoint folders, judges whether one is complete (from its files, never
    from timing: the caller adds the quiet period), says its step, and turns it into a folder that
    ``transformers.AutoModelForCausalLM.from_pretrained`` loads. Everything but ``materialise`` is cheap
    and reads only small files; ``materialise`` runs in the worker and may convert (DeepSpeed ZeRO,
    DCP), but never unpickles anything beyond ``torch.load(weights_only=True)``.
    """

    name: ClassVar[str]

    @abstractmethod
    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        """Whether ``directory`` (with these files) is a checkpoint of this layout, complete or not."""

    @abstractmethod
    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        """Readiness from the files; may read small files in ``directory`` and beside it (``latest``)."""

    def step(self, directory: Path) -> tuple[int | None, int | None]:
        """(step, epoch) of the checkpoint; by default from the folder's name."""
        return parse_step(directory.name)

    def shape(self, directory: Path) -> Shape:
        """Which kind of save ``directory`` is; a trainer's resumable state unless the layout says not."""
        return Shape.RESUMABLE

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        """A folder ``from_pretrained`` can load (``scratch`` is empty and the worker's to use)."""
        return directory
