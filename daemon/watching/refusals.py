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
    shown = sorted(names)[:4]
    files = f"{len(names)} files: {', '.join(shown)}{', ...' if len(names) > len(shown) else ''}"
    return (
        f"no checkpoint layout recognised in it after {waited:.0f} s ({files if names else 'no files'}); "
        "not a checkpoint, or one of a layout to name in runs[].layout"
    )
