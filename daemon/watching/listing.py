"""Walks of folders that other threads and processes change while they are walked.

A download renames its ``.partial`` folder into place, an eviction removes a copy, a trainer rotates a
checkpoint: ``Path.rglob`` and ``os.walk`` then meet an entry that is gone or is no longer what it was
listed as (``rglob`` raised ``FileNotFoundError`` on a ``.partial`` folder a finishing download had just
renamed). Here every such entry is skipped: it was not there, or is seen by the next walk. Iterative, so
no depth meets the interpreter's recursion limit.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path


def files_under(folder: Path, suffix: str = "") -> Iterator[tuple[Path, os.stat_result]]:
    """Every regular file under ``folder`` whose name ends with ``suffix``, with its ``stat``; symlinks are
    not followed. Nothing when ``folder`` itself is gone."""
    stack = [str(folder)]
    while stack:
        current = stack.pop()
        try:
            with os.scandir(current) as listing:
                entries = list(listing)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.name.endswith(suffix):
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode):
                        yield Path(entry.path), info
            except (FileNotFoundError, NotADirectoryError):
                continue
