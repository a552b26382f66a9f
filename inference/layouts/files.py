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
import math
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
#: The deepest JSON any file of a checkpoint may nest. Real configs, indexes and tokenizers nest under ten
#: levels; the ``tokenizers`` library (serde_json) refuses more than 128 at load, so a deeper tokenizer
#: would pass the scan and fail in the worker: 64 is far above every real file and below that.
MAX_JSON_DEPTH = 64

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


def not_a_file(path: Path) -> str | None:
    """What ``path`` is when a file is needed there and it is none, in words: a directory, a symlink to
    nothing or a symlink loop; ``None`` when it is a file (or not there at all: it may come)."""
    try:
        info = path.lstat()
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode):
        return "is a directory, not a regular file"
    if not stat.S_ISLNK(info.st_mode):
        return None
    try:
        path.stat()
    except FileNotFoundError:
        try:
            target = str(path.readlink())
        except OSError:
            return None  # replaced meanwhile: the next look sees what it is now
        return f"is a symlink to {target!r}, which does not exist"
    except OSError as exc:
        return f"is a symlink that cannot be followed ({exc.strerror})"
    return None


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


def parse_json(text: str, name: PurePath | str, *, allow_nan: bool = False) -> Any:
    """``json.loads(text)``, strict, bounded, and refused by name (:class:`FileRefused`) when it is not.

    Refused: JSON nested more than :data:`MAX_JSON_DEPTH` deep (one nested deeper than the parser recurses
    stops it within its first thousand brackets: ``RecursionError``, caught), a key twice in one object
    (which value wins differs between readers: Python keeps the last, another reader may keep the first),
    ``NaN``/``Infinity`` and numbers beyond a float's range (no JSON standard has them; in a config they
    end in a crash at load), and integers Python will not convert (more than 4,300 digits). These are
    final: a half-written file is a prefix of the whole one, which holds the same. ``allow_nan`` admits
    ``NaN`` and infinities where a writer puts them in good files (``trainer_state.json``'s
    ``log_history`` of a diverging run). ``json.JSONDecodeError`` passes through: callers tell a
    half-written file from a wrong one.
    """
    path = PurePath(name)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        found = dict(items)
        if len(found) != len(items):  # a key twice: looked for in Python only then
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    raise FileRefused(path, f"holds the key {_short(key)} twice in one object")
                seen.add(key)
        return found

    def constant(word: str) -> Any:
        raise FileRefused(path, f"holds {word}, which strict JSON has no place for")

    def number(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise FileRefused(path, f"holds the number {_short(literal)}, beyond a float's range")
        return value

    try:
        if allow_nan:
            value = json.loads(text, object_pairs_hook=pairs)
        else:
            value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    except RecursionError as exc:
        raise FileRefused(path, TOO_DEEP) from exc
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # an integer of more digits than int() converts
        raise FileRefused(path, f"holds a number that cannot be read ({exc})") from exc
    if nesting(value) > MAX_JSON_DEPTH:
        raise FileRefused(path, f"{TOO_DEEP} (more than {MAX_JSON_DEPTH} levels)")
    return value


def nesting(value: Any) -> int:
    """How deep ``value`` (parsed JSON) nests: 0 for a scalar, 1 for a flat list or object; iterative, so
    it never recurses itself, and it stops counting past :data:`MAX_JSON_DEPTH`.

    A container holding no container (a tokenizer's 150,000 two-word merges) is counted where it is met,
    from the types of its items, without a stack entry of its own: that halves the walk of a tokenizer
    (``bench/scan_checks.py``).
    """
    if not isinstance(value, (dict, list)):
        return 0
    deepest = 1
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and deepest <= MAX_JSON_DEPTH:
        container, depth = stack.pop()
        items = container.values() if type(container) is dict else container
        for item in items:
            kind = type(item)
            if kind is not dict and kind is not list:
                continue
            inner = item.values() if kind is dict else item
            if _CONTAINERS.isdisjoint(map(type, inner)):
                deepest = max(deepest, depth + 1)
            else:
                stack.append((item, depth + 1))
    return deepest


_CONTAINERS = frozenset({dict, list})


def _short(text: str, limit: int = 60) -> str:
    """``text`` for a reason: quoted, and cut when long (a key may be megabytes)."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


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
