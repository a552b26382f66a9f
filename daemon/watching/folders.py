"""Which folders under a run root could be checkpoints, and what a folder's name and files say of it.

Reads the filesystem (lists, stats, one small JSON file) and decides nothing about readiness: that is
:mod:`daemon.watching.readiness`'s, and what to record is :mod:`daemon.watching.discovery`'s.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import stat
from pathlib import Path

from daemon.watching import refusals
from inference import layouts

#: Files trainers keep beside their checkpoint folders to say which one is newest.
TRACKER_FILES = frozenset({"latest", "latest_checkpointed_iteration.txt"})
#: Files that make a folder a checkpoint of its own (a model's config and weights at its top), as
#: opposed to what tools leave beside checkpoint folders: DeepSpeed's ``zero_to_fp32.py`` and
#: ``zero_to_torch.py`` (copied into the save_dir under ZeRO), trackers, READMEs, logs, ``.nfs*`` files.
OWN_CHECKPOINT_FILE = re.compile(
    r"config\.json|.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?|.*\.distcp"
    r"|.*model_states\.pt"
)
_HAS_DIGIT = re.compile(r"\d")
#: Files whose change after a checkpoint was judged ready means its weights changed.
WEIGHT_FILE = re.compile(r".*\.(?:safetensors|bin|pt|pth|distcp)")
#: The most entries of one folder these checks list (a checkpoint's own listing refuses more).
_LISTED_MAX = layouts.base.MAX_TREE_ENTRIES
#: The most of a run root's ``trainer_state.json`` read to find the step of a model saved there.
_TRAINER_STATE_MAX = 16 * 1024 * 1024


def subdirs(folder: Path, passed_over: list[Path] | None = None) -> list[Path]:
    """The folders in ``folder`` that could be checkpoints (``OSError`` if it cannot be listed); those
    whose name says they are being written or hidden but carries a step go to ``passed_over``."""
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for path in sorted(entries):
        if not layouts.is_ignored_name(path.name):
            if _is_dir(path) and not is_tracker_folder(path):
                found.append(path)
        elif passed_over is not None and layouts.parse_step(path.name) != (None, None) and _is_dir(path):
            passed_over.append(path)
    return found


#: Folders experiment trackers write under a run root (W&B's ``wandb/``, MLflow's ``mlruns/``, evald's own
#: TensorBoard folder): known, never checkpoints, passed over without a word.
TRACKER_FOLDERS = frozenset({"wandb", "mlruns", "evald_tensorboard"})
#: TensorBoard's usual folder names (HF Trainer's ``runs/``, verl's ``tensorboard_log/``): passed over
#: only when they hold event files, since a folder of that name may also hold checkpoints.
_EVENT_FOLDERS = frozenset({"runs", "tensorboard", "tensorboard_log", "tb_logs", "logs"})
_EVENT_FILE = "events.out.tfevents."


def is_tracker_folder(path: Path) -> bool:
    """Whether ``path`` is a tracker's folder (:data:`TRACKER_FOLDERS`, or a TensorBoard one holding event
    files, in it or one folder down, and no model), not a checkpoint nor a folder of them."""
    if path.name in TRACKER_FOLDERS:
        return True
    if path.name not in _EVENT_FOLDERS:
        return False
    events = False
    try:
        for entry in itertools.islice(path.iterdir(), _LISTED_MAX):
            inside = list(itertools.islice(entry.iterdir(), _LISTED_MAX)) if entry.is_dir() else [entry]
            if any(OWN_CHECKPOINT_FILE.fullmatch(f.name) for f in inside):
                return False
            events = events or any(f.name.startswith(_EVENT_FILE) for f in inside)
    except OSError:
        return False  # looked at as a folder of its own, which records why it cannot be read
    return events


def _is_dir(path: Path) -> bool:
    """``Path.is_dir`` that says yes to a folder it cannot stat (EACCES, EIO) and has a step in its name,
    and to a symlink loop (``step_250 -> step_251 -> step_250``): that one is looked at, so that its error
    is recorded against it instead of failing the whole scan or being passed over without a word."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF):
            return False
        return exc.errno == errno.ELOOP or layouts.parse_step(path.name) != (None, None)


def is_container(folder: Path) -> bool:
    """A folder that holds checkpoint folders rather than being one (OpenRLHF's ``_actor``, any
    DeepSpeed ``save_dir`` below the run root).

    Its name is none a layout owns (no step word: ``checkpoint-N``, ``global_stepN``, ...), it holds a
    tracker such as ``latest`` or a sub-folder whose name carries a step, and no model of its own (see
    :data:`OWN_CHECKPOINT_FILE`): DeepSpeed's recovery scripts, logs, a README or, beside ``latest``, the
    model's ``config.json`` do not make it a checkpoint (they did: OpenRLHF's ``_actor`` under ZeRO was
    passed over without a word).
    Digits in its name (``ds2``, ``Qwen2.5-7B-Instruct``) do not make it one either: they name a model.
    """
    if layouts.parse_step(folder.name, bare_number=False) != (None, None):
        return False
    try:
        entries = list(itertools.islice(folder.iterdir(), _LISTED_MAX + 1))
    except OSError:
        return False  # unreadable: looked at as a folder of its own, which records why
    if len(entries) > _LISTED_MAX:
        return False  # looked at as a folder of its own, whose listing refuses it
    has_subdir = holds_steps = tracked = False
    own: set[str] = set()
    for entry in entries:
        if _is_dir(entry):
            has_subdir = True
            named = not layouts.is_ignored_name(entry.name)
            # Any number in a sub-folder's name counts (``wandb/run-20261201_120000-ab12cd34``): what is in
            # a container is looked at, and named if it is no checkpoint, instead of the container alone.
            holds_steps = holds_steps or (named and _HAS_DIGIT.search(entry.name) is not None)
        elif entry.name in TRACKER_FILES:
            holds_steps = tracked = True
        elif OWN_CHECKPOINT_FILE.fullmatch(entry.name):
            own.add(entry.name)
    # A model config beside ``latest`` is a training script's ``model.config.save_pretrained(save_dir)``
    # (DeepSpeed's own examples do it), not a model: read as one, the save_dir was the one tag ``latest``
    # named when first seen, and every other tag was never evaluated.
    return has_subdir and holds_steps and (not own or (tracked and own == {"config.json"}))


def stray_files(root: Path) -> list[tuple[Path, int]]:
    """(path, step) of the files (not folders) directly in ``root`` whose name carries a step word
    (``step_3021``, ``checkpoint-500.tar``): named like checkpoints, but no layout reads a lone file."""
    found: list[tuple[Path, int]] = []
    try:
        with os.scandir(root) as entries:
            for entry in itertools.islice(entries, _LISTED_MAX):
                if entry.name in TRACKER_FILES or layouts.is_ignored_name(entry.name):
                    continue
                step, _ = layouts.parse_step(entry.name, bare_number=False)
                if step is not None and not _is_dir(Path(entry.path)):
                    found.append((Path(entry.path), step))
    except OSError:
        return []  # the root cannot be listed: the scan says so
    return sorted(found)


def candidate_dirs(root: Path, passed_over: list[Path] | None = None) -> list[Path]:
    """The folders under a run root that could be checkpoints: its children, and a container's; folders
    named as being written (``tmp-checkpoint-5``) go to ``passed_over``, to be reported."""
    found: list[Path] = []
    for child in subdirs(root, passed_over):
        if not is_container(child):
            found.append(child)
            continue
        try:
            found.extend(subdirs(child, passed_over))
        except OSError:
            found.append(child)  # emptied or made unreadable since: its own look says which
    return found


def top_level_child(root: Path, path: Path) -> Path | None:
    """The child of ``root`` that an event at ``path`` concerns."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return None
    if not parts or layouts.is_ignored_name(parts[0]) or is_tracker_folder(root / parts[0]):
        return None
    return root / parts[0]


def step_of(
    path: Path, layout: str | None, *, raising: bool = False
) -> tuple[int | None, int | None, str | None]:
    """(step, epoch, problem): both ``None`` with the problem when the name's cannot be stored, or the
    layout could not read it; with ``raising``, an ``OSError`` reading it is the caller's to place."""
    try:
        if layout is not None and layout in layouts.REGISTRY:
            step, epoch = layouts.get(layout).step(path)
        else:
            step, epoch = layouts.parse_step(path.name)
    except OSError:
        if raising:
            raise
        return (
            None,
            None,
            f"cannot read the step of {refusals.shown(path.name)}: the folder is unreadable",
        )
    except MemoryError:
        raise
    except Exception as exc:
        message = " ".join(str(exc).split())[:300]
        return (
            None,
            None,
            f"cannot read the step of {refusals.shown(path.name)}: {type(exc).__name__}: {message}",
        )
    problem = layouts.step_problem(path.name, step, epoch)
    return (None, None, problem) if problem is not None else (step, epoch, None)


def shape(layout: str, path: Path) -> layouts.Shape:
    """The shape a folder of this layout has (an HF export, a resumable checkpoint)."""
    return layouts.get(layout).shape(path) if layout in layouts.REGISTRY else layouts.Shape.RESUMABLE


def root_problem(root: Path) -> str | None:
    """Why a run root cannot be watched although something is there (a symlink loop, a permission), or
    ``None``: one that does not exist yet is not a problem (the trainer creates it)."""
    try:
        root.stat()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        if exc.errno == errno.ELOOP:
            return f"the run root {root} is a symlink loop ({exc.strerror}): not watched until it is fixed"
        return f"the run root {root} cannot be read ({exc.strerror}): not watched until it can"
    return None


def trainer_state_step(path: Path) -> int | None:
    """``global_step`` of a ``trainer_state.json``; ``None`` when there is none, or it is not a small
    regular file (never opened then: a FIFO would block) or holds no usable step."""
    try:
        # Opened without blocking and judged by what was opened: a FIFO swapped in never holds the loop.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > _TRAINER_STATE_MAX:
                return None
            data = json.loads(handle.read(_TRAINER_STATE_MAX))
    except (OSError, ValueError, RecursionError):
        return None
    step = data.get("global_step") if isinstance(data, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
