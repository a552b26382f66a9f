"""Why discovery refuses a folder it cannot safely look into: symlinks that lead back or out, files that
cannot be read (pure: resolved paths and errors in, a reason or a verdict out).

A symlinked checkpoint folder is followed only when it resolves to a folder strictly inside the run root
that does not hold the link itself: one that resolves to the root, to an ancestor of it, or to the folder
the link sits in would make the checkpoint contain itself (its snapshot would walk the whole run, and
every other checkpoint with it); one that leaves the root is not this run's to read.
"""

from __future__ import annotations

import errno
import os
import re
import unicodedata

#: Errors worth another look: the storage may answer later (a network filesystem's hiccup, a busy or
#: briefly unavailable server). Anything else (a symlink loop, a permission, a name too long) stays as it
#: is until someone changes it, so the checkpoint is refused at once.
TRANSIENT_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.ESTALE,
        errno.EAGAIN,
        errno.EINTR,
        errno.ETIMEDOUT,
        errno.EBUSY,
        errno.ENOMEM,
        errno.ENOBUFS,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENETDOWN,
        errno.ENETUNREACH,
        errno.ECONNRESET,
        errno.ENOLINK,
        errno.ECOMM,
    }
)


def is_transient(error_number: int | None) -> bool:
    """Whether an ``OSError`` with this ``errno`` may go away by itself (pure)."""
    return error_number in TRANSIENT_ERRNOS


def _under(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it (both resolved)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def link_problem(name: str, real: str, real_root: str, real_parent: str) -> str | None:
    """Why the candidate folder ``name``, which resolves to ``real``, cannot be read as a checkpoint of
    the run whose root resolves to ``real_root``; ``real_parent`` is where the folder it is listed in
    resolves to. ``None`` when it can (pure)."""
    if real == real_root:
        return f"symlink {name} resolves to the run root itself ({real}): a checkpoint cannot hold the run"
    if _under(real_root, real):
        return f"symlink {name} resolves to {real}, an ancestor of the run root {real_root}"
    if not _under(real, real_root):
        return f"symlink {name} leaves the watched root {real_root} (it resolves to {real})"
    if _under(real_parent, real):
        return f"symlink {name} resolves to {real}, a folder that holds the link itself (a loop)"
    return None


def read_problem(exc: OSError, root: str) -> str:
    """What to say about an error met while looking at a checkpoint: the path it concerns (under
    ``root`` when it is there) and the error (pure)."""
    filename = exc.filename if isinstance(exc.filename, str) else None
    where = filename or "the checkpoint"
    if filename is not None and _under(filename, root):
        where = os.path.relpath(filename, root)
    strerror = exc.strerror or str(exc)
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else type(exc).__name__
    if exc.errno == errno.ELOOP:
        return f"symlink loop at {where}: {strerror} ({code})"
    return f"cannot read {where}: {strerror} ({code})"


#: Why a folder named like ``tmp-checkpoint-5`` or ``step_9.tmp`` is passed over.
IGNORED_NAME = (
    "its name marks a folder still being written, or a hidden one (tmp-*, tmp_*, .*, *.tmp, *.partial, "
    "*.incomplete): looked at once the trainer renames it"
)


def unrecognised(waited: float, names: frozenset[str]) -> str:
    """Why a folder seen for ``waited`` seconds, holding ``names``, is not taken for a checkpoint (pure)."""
    listed = sorted(names)[:4]
    files = f"{len(names)} files: {', '.join(listed)}{', ...' if len(names) > len(listed) else ''}"
    return (
        f"no checkpoint layout recognised in it after {waited:.0f} s ({files if names else 'no files'}); "
        "not a checkpoint, or one of a layout to name in runs[].layout"
    )


# Trainers whose checkpoints no layout reads: their own formats, which only their converters turn into
# weights ``from_pretrained`` loads. Told apart by the files' places, so that the refusal says what to run.
_MEGATRON = re.compile(r"(?:[^/]+/)?mp_rank_\d+(?:_\d+)?/(?:model_optim_rng|distrib_optim)\.pt")
_NEMO_RL = re.compile(r"policy/weights/.+")


def unsupported(names: frozenset[str]) -> str | None:
    """Why a folder holding ``names`` is a checkpoint of a trainer evald cannot read, with how to export
    weights it can, or ``None`` when the files are of no such trainer (pure)."""
    then = "then point runs[].root at the folder that holds the exported checkpoints"
    if any(_MEGATRON.fullmatch(name) for name in names):
        return (
            "a Megatron-LM checkpoint (mp_rank_*/model_optim_rng.pt): not supported; export HF weights with "
            "Megatron-LM's tools/checkpoint/convert.py --saver hf (or Megatron-Bridge's export), " + then
        )
    if any(_NEMO_RL.fullmatch(name) for name in names):
        return (
            "a NeMo-RL checkpoint (policy/weights/): not supported; export HF weights with NeMo-RL's "
            "examples/converters/convert_dcp_to_hf.py, " + then
        )
    return None


def shown(text: str) -> str:
    """``text`` as it can be stored and printed: control characters and bytes that are not UTF-8 (which
    Python holds as lone surrogates) escaped as Python writes them, ``step_340\\n``, ``step_7\\xff``
    (pure)."""
    out = []
    for char in text:
        category = unicodedata.category(char)
        if category == "Cs" and 0xDC80 <= ord(char) <= 0xDCFF:
            out.append(f"\\x{ord(char) - 0xDC00:02x}")  # surrogateescape: the byte it stands for
        elif category in ("Cc", "Cs"):
            out.append(repr(char)[1:-1])
        else:
            out.append(char)
    return "".join(out)


#: The longest folder name taken as a checkpoint: trainers name theirs in a few words (``checkpoint-500``,
#: ``epoch1epochstep20globalstep300``, ``global_step100_hf``); a step read from a longer one would be a guess
#: (``step_3017`` followed by 240 more characters was taken as step 3017).
NAME_MAX = 128


def name_problem(name: str) -> str | None:
    """Why a folder called ``name`` is never taken as a checkpoint, or ``None`` (pure): a control
    character (a newline would make ``step_340\\n`` a second step 340, shadowing the real one, and split
    every log line), bytes that are not UTF-8 (no database stores them), or more than :data:`NAME_MAX`
    characters."""
    escaped = shown(name)
    if escaped != name:
        return (
            f"folder name '{escaped}' holds a control character or bytes that are not UTF-8: never taken as "
            "a checkpoint; rename it"
        )
    if len(name) > NAME_MAX:
        return (
            f"folder name '{name[:40]}...' is {len(name)} characters long (at most {NAME_MAX} are read as a "
            "checkpoint's name): never taken as a checkpoint; rename it"
        )
    return None


def stray_file(name: str, step: int) -> str:
    """Why a file (not a folder) in the run root named like a checkpoint is not evaluated (pure)."""
    return (
        f"'{shown(name)}' is a file named like a checkpoint (step {step}), but a checkpoint is a folder: "
        "not evaluated (an archive or a lone weights file is no layout evald reads; unpack or save it "
        "into a folder)"
    )


def root_model(files: list[str], step: int | None) -> str:
    """Why a model saved straight into the run root (``trainer.save_model(output_dir)`` at the end of a TRL
    or HF run) is not evaluated, and how to have it evaluated (pure)."""
    at = f" (trainer_state.json: global_step {step})" if step is not None else ""
    return (
        f"the run root itself holds a model{at} ({', '.join(files)}), what trainer.save_model(output_dir) "
        "writes at the end of a run: it is not a checkpoint folder, so the daemon does not evaluate it; "
        "evaluate it once with `evald eval <root>`, or save it into a sub-folder of the root (final/, "
        "checkpoint-N/) where discovery takes it"
    )


def overwritten(name: str, step: int | None, changed: str) -> str:
    """What to say about a checkpoint whose weights changed after it was judged ready (pure)."""
    return (
        f"checkpoint {name} (step {step}) was overwritten in place after it was judged ready ({changed}): "
        "its results are of the earlier weights and it is not evaluated again; save new weights under a "
        "new step"
    )


#: Why a folder that turned out to hold checkpoints (an engine save_dir made empty before its first save)
#: stopped being one.
CONTAINER = "a folder of checkpoints (such as a DeepSpeed save_dir), not one: each one in it is looked at"
