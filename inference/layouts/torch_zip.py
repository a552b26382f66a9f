"""What a whole ``torch.save`` file says about itself, read without unpickling anything.

``torch.save`` writes a zip archive (:func:`inference.layouts.hf.read_torch_zip_end` tells whether it is
whole); its ``data.pkl`` holds the pickled object, tensors stored as separate entries; scanning the pickle's
opcodes (``pickletools.genops`` parses, it never calls anything) finds small integers stored under a key,
such as the world sizes DeepSpeed records, without running code from a file the trainer wrote.
"""

from __future__ import annotations

import pickletools
import zipfile
from dataclasses import dataclass
from pathlib import Path

from inference.layouts import files

_INT_OPS = frozenset({"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4"})
_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"})
_MEMO_OPS = frozenset({"BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"})
#: ``data.pkl`` of a state dict is kilobytes (tensors live elsewhere); a far larger one is not read.
MAX_PICKLE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class ArchiveProbe:
    """The integers found under the keys asked for, or why the archive could not be read."""

    integers: dict[str, int]
    problem: str | None = None


def probe(path: Path, keys: frozenset[str]) -> ArchiveProbe:
    """Open ``path`` as a torch zip archive and find the first integer stored under each of ``keys``.

    ``problem`` says why the archive could not be read. Raises ``FileNotFoundError`` if the file is gone
    and :class:`~inference.errors.FileRefused` if it is not a regular file.
    """
    try:
        with files.opened(path) as handle, zipfile.ZipFile(handle) as archive:
            pickles = [info for info in archive.infolist() if info.filename.endswith("/data.pkl")]
            if len(pickles) != 1:
                return ArchiveProbe({}, f"holds {len(pickles)} data.pkl entries, not 1")
            if pickles[0].file_size > MAX_PICKLE_BYTES:
                return ArchiveProbe({}, f"data.pkl is {pickles[0].file_size} bytes, too large to scan")
            data = archive.read(pickles[0])
    except zipfile.BadZipFile as exc:
        return ArchiveProbe({}, f"not a readable zip archive ({exc})")
    return ArchiveProbe(integers_under(data, keys))


def integers_under(data: bytes, keys: frozenset[str]) -> dict[str, int]:
    """The first integer value pickled right after each key string in ``data`` (pure; never unpickles)."""
    found: dict[str, int] = {}
    pending: str | None = None
    try:
        for opcode, argument, _ in pickletools.genops(data):
            if opcode.name in _MEMO_OPS:
                continue
            if pending is not None and opcode.name in _INT_OPS and isinstance(argument, int):
                found.setdefault(pending, argument)
            pending = (
                argument
                if opcode.name in _STRING_OPS and isinstance(argument, str) and argument in keys
                else None
            )
    except (ValueError, EOFError):
        pass  # a malformed pickle: report what was found before it; the caller names what is missing
    return found
