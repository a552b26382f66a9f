"""Reading the small files of a checkpoint tree: never blocking, never whole when huge, never too deep.

The daemon's main loop judges folders a trainer (or anyone with write access) fills, so every read a
layout does goes through here. ``open()`` on a FIFO waits for a writer forever, and on a character device
may never end, so only regular files are read: the type is checked before opening (for a clear reason),
the file is opened with ``O_NONBLOCK`` and checked again on the open descriptor (it may have been swapped
in between). A read stops at a cap (a 5 GB ``config.json`` is refused from its size, not read), and JSON
nested deeper than the parser recurses (``'[' * 100000``: ``RecursionError``, raised within the first
thousand brackets) is refused by name. A file refused here raises :class:`~inference.errors.FileRefused`, a
:class:`~inference.errors.CheckpointInvalid`: final, since no quiet period changes what the file is, and
:func:`judged` turns it into the folder's ``invalid`` verdict naming the file.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import IO, Any, Concatenate, ParamSpec

from inference.errors import FileRefused
from inference.layouts.base import Readiness, Verdict

#: ``config.json``, an index, ``trainer_state.json``, a tokenizer: real ones stay far below (the largest
#: tokenizers are about 35 MB; an index of a 400B model about 2 MB).
MAX_JSON_BYTES = 64 * 1024 * 1024
#: ``latest`` and ``latest_checkpointed_iteration.txt`` hold a tag or a number.
MAX_TAG_BYTES = 4096
#: What a reason says of JSON the parser refused to descend into.
TOO_DEEP = "holds JSON nested too deep to parse"

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)

P = ParamSpec("P")


def kind(mode: int) -> str:
    """What a file of ``mode`` is, in words (``"a FIFO"``); ``"a regular file"`` for one."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _check_regular(path: Path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise FileRefused(path, f"is {kind(mode)}, not a regular file")


def _check_size(path: Path, size: int, limit: int) -> None:
    if size > limit:
        raise FileRefused(path, f"is {size} bytes, more than the {limit} read of it")


@contextmanager
def opened(path: Path, *, limit: int | None = None) -> Iterator[IO[bytes]]:
    """``path`` opened for reading in binary, only if it is a regular file (of at most ``limit`` bytes).

    Raises :class:`FileRefused` naming what it is instead, ``FileNotFoundError`` if it is not there, and
    other ``OSError`` (a symlink loop, no permission) as they come.
    """
    _check_regular(path, path.stat().st_mode)
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        # Swapped for a FIFO between the stat and the open: O_NONBLOCK made the open return at once.
        info = os.fstat(descriptor)
        _check_regular(path, info.st_mode)
        if limit is not None:
            _check_size(path, info.st_size, limit)
        # A regular file ignores O_NONBLOCK; clearing it keeps reads plain for zipfile and friends.
        os.set_blocking(descriptor, True)
        handle = os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise
    with handle:
        yield handle


def read_bytes(path: Path, *, limit: int) -> bytes:
    """The whole of regular file ``path``, refused when larger than ``limit`` bytes (even if it grew)."""
    with opened(path, limit=limit) as handle:
        data = handle.read(limit + 1)
    _check_size(path, len(data), limit)
    return data


def read_text(path: Path, *, limit: int = MAX_JSON_BYTES, errors: str = "strict") -> str | None:
    """A small text file, ``None`` if it is not there (yet); ``"\\ufffd"`` if it is not UTF-8 and
    ``errors`` is strict, so a JSON check that follows reports it."""
    try:
        data = read_bytes(path, limit=limit)
    except FileNotFoundError:
        return None
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError:
        return "\ufffd"


def parse_json(text: str, name: PurePath | str) -> Any:
    """``json.loads(text)``, refused (:class:`FileRefused` naming ``name``) when nested too deep.

    The parser's own recursion limit is the bound: it stops a hostile file within its first thousand
    brackets, at no cost to a normal one (a scan of the brackets first cost twice the parse). Real
    configs, indexes and tokenizers nest a few levels. ``json.JSONDecodeError`` passes through: callers
    tell a half-written file from a wrong one.
    """
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise FileRefused(PurePath(name), TOO_DEEP) from exc


def shown(path: PurePath, directory: Path) -> str:
    """``path`` as a reason names it: relative to the checkpoint ``directory`` when inside it."""
    if path.is_absolute() and path.is_relative_to(directory):
        return str(path.relative_to(directory))
    return str(path)


def refusal(directory: Path, exc: FileRefused) -> Verdict:
    """The folder's final verdict for a file of it refused: ``invalid``, naming the file."""
    return Verdict(Readiness.INVALID, f"{shown(exc.path, directory)} {exc.problem}", final=True)


def judged(
    inspect: Callable[Concatenate[Path, P], Verdict],
) -> Callable[Concatenate[Path, P], Verdict]:
    """Decorate a layout's ``inspect(directory, ...)``: a file refused while judging becomes the folder's
    ``invalid`` verdict (:func:`refusal`) instead of an exception."""

    @functools.wraps(inspect)
    def guarded(directory: Path, /, *args: P.args, **kwargs: P.kwargs) -> Verdict:
        try:
            return inspect(directory, *args, **kwargs)
        except FileRefused as exc:
            return refusal(directory, exc)

    return guarded
