"""The local mirror of an ``s3://`` run root, which discovery judges exactly as it judges a local root.

Every listed object becomes a file of the same path, size and modification time, so a checkpoint's
snapshot, its quiet period and every layout's readiness rule are the local ones, unchanged. Only what
those rules read is downloaded: small metadata files whole (``config.json``, an index, ``latest``,
``trainer_state.json``, DCP's ``.metadata``), and of a weight file its first bytes (the safetensors header,
through a ranged GET) and, for a ``torch.save`` zip, its last ones; the rest of a weight file is a hole
(a sparse file: no disk used). So the mirror is never loaded: a due checkpoint is downloaded whole
(:mod:`daemon.watching.object_cache`).

A multipart upload in progress is not listed by S3 until it completes, so a shard being uploaded is a
missing shard here; its parts so far appear as a hidden ``.NAME.uploading`` file beside it (see
:mod:`daemon.watching.object_runs`), which keeps the checkpoint changing while the upload goes on. A
pass that cannot finish (the store away, an object replaced while read) changes nothing it has not
finished, and says so: the caller does not judge the run until a pass completes.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from daemon.watching.objects import ObjectChanged, ObjectGone, ObjectInfo, Store
from inference.layouts import files

#: Files whose content readiness reads: JSON, text, trackers and markers (no extension), DCP metadata.
_CONTENT = re.compile(r"(?:.*\.(?:json|txt)|[^.]+|\.metadata)")
#: Weight files whose first (and, for zips, last) bytes readiness reads.
_WEIGHTS = re.compile(r".*\.(?:safetensors|bin|pt|pth)")
#: A weight file up to this size is mirrored whole (one GET either way).
WHOLE_BYTES = 1024 * 1024
#: The first bytes of a weight file read: a safetensors header of a large model fits (one of more is
#: completed by a second read).
HEAD_BYTES = 1024 * 1024
#: The last bytes of a ``torch.save`` zip read: its end records and central directory.
TAIL_BYTES = 4 * 1024 * 1024
#: The longest name a local filesystem takes for one path part.
_NAME_MAX = 255


@dataclass(frozen=True)
class Plan:
    """What one pass changes in the mirror (pure result of :func:`plan`)."""

    write: tuple[ObjectInfo, ...]
    delete: tuple[str, ...]
    #: Keys that cannot be mirrored, with why (an unsafe name): said once by the caller.
    refused: tuple[tuple[str, str], ...]


@dataclass
class Outcome:
    """What a pass did."""

    written: int = 0
    deleted: int = 0
    #: Objects not mirrored this pass (deleted or replaced after the listing): the next pass lists again.
    unsettled: list[str] = field(default_factory=list)


def key_problem(relkey: str) -> str | None:
    """Why an object's key cannot be a local path under the mirror, or ``None`` (pure)."""
    parts = relkey.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "its key has an empty, '.' or '..' part"
    if "\x00" in relkey:
        return "its key holds a NUL character"
    if any(len(part.encode("utf-8", "surrogateescape")) > _NAME_MAX for part in parts):
        return f"a part of its key is longer than {_NAME_MAX} bytes"
    return None


def plan(listed: Iterable[ObjectInfo], local: dict[str, tuple[int, int]]) -> Plan:
    """Which objects to (re)write and which local files to delete so the mirror matches ``listed``
    (pure). ``local`` maps each mirrored file's relative path to its (size, mtime_ns)."""
    objects: dict[str, ObjectInfo] = {}
    refused: list[tuple[str, str]] = []
    for info in listed:
        if info.relkey.endswith("/") and info.size == 0:
            continue  # a "folder" made by a console: the objects under it say what is there
        problem = key_problem(info.relkey)
        if problem is not None:
            refused.append((info.relkey, problem))
            continue
        objects[info.relkey] = info
    # A key that is also a "folder" of other keys (``a`` and ``a/b``) cannot be both locally: the folder wins.
    folders = {"/".join(k.split("/")[:i]) for k in objects for i in range(1, k.count("/") + 1)}
    for clash in sorted(folders & objects.keys()):
        refused.append((clash, "it is also the folder of other objects"))
        del objects[clash]
    write = tuple(
        info for key, info in sorted(objects.items()) if local.get(key) != (info.size, info.mtime_ns)
    )
    delete = tuple(sorted(k for k in local if k not in objects))
    return Plan(write, delete, tuple(refused))


def local_files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under the mirror root, with its size and mtime."""
    found: dict[str, tuple[int, int]] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            found[str(path.relative_to(root))] = (info.st_size, info.st_mtime_ns)
    return found


class Mirror:
    """Keeps one run's mirror folder in step with its prefix's listing."""

    def __init__(self, store: Store, root: Path, scratch: Path) -> None:
        self._store = store
        self.root = root
        #: Where files are written before being renamed into place (same filesystem as the mirror).
        self._scratch = scratch

    def apply(self, listed: list[ObjectInfo]) -> tuple[Plan, Outcome]:
        """Bring the mirror in line with ``listed`` (a complete listing)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._scratch.mkdir(parents=True, exist_ok=True)
        changes = plan(listed, local_files(self.root))
        outcome = Outcome()
        if changes.write:
            workers = min(self._store.settings.max_concurrency, len(changes.write))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evald-mirror") as pool:
                results = list(pool.map(self._write, changes.write))
            for info, written in zip(changes.write, results, strict=True):
                if written:
                    outcome.written += 1
                else:
                    outcome.unsettled.append(info.relkey)
        for relpath in changes.delete:
            try:
                (self.root / relpath).unlink()
                outcome.deleted += 1
            except FileNotFoundError:
                pass
        if changes.delete:
            _prune_empty(self.root)
        return changes, outcome

    def _write(self, info: ObjectInfo) -> bool:
        """Mirror one object; False when it went or changed after the listing (the next pass sees it)."""
        try:
            parts = self._parts(info)
        except (ObjectGone, ObjectChanged):
            return False
        target = self.root / info.relkey
        temporary = self._scratch / f"{uuid.uuid4().hex}.part"
        try:
            with temporary.open("wb") as handle:
                handle.truncate(info.size)  # the holes: no blocks used
                for offset, data in parts:
                    os.pwrite(handle.fileno(), data, offset)
            os.utime(temporary, ns=(info.mtime_ns, info.mtime_ns))
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir():
                # An object now where a folder of objects was: the folder's files were deleted first.
                _remove_tree(target)
            temporary.replace(target)
        finally:
            temporary.unlink(missing_ok=True)
        return True

    def _parts(self, info: ObjectInfo) -> list[tuple[int, bytes]]:
        """The byte ranges of ``info`` readiness reads, fetched: (offset, data) pairs."""
        name = info.relkey.rsplit("/", 1)[-1]
        size, read = info.size, self._store.read
        if size == 0:
            return []
        whole_limit = files.MAX_JSON_BYTES if _CONTENT.fullmatch(name) else 0
        if _WEIGHTS.fullmatch(name):
            whole_limit = WHOLE_BYTES
        if size <= whole_limit:
            return [(0, read(info.relkey, 0, size - 1, info.etag))]
        if not _WEIGHTS.fullmatch(name):
            return []  # a file no readiness rule reads (a tokenizer model, a huge text): its size is enough
        head = read(info.relkey, 0, min(size, HEAD_BYTES) - 1, info.etag)
        parts = [(0, head)]
        if name.endswith(".safetensors") and len(head) >= 8:
            header_end = 8 + int.from_bytes(head[:8], "little")
            if len(head) < header_end <= min(size, 8 + 100 * 1024 * 1024):
                parts.append((len(head), read(info.relkey, len(head), header_end - 1, info.etag)))
        elif not name.endswith(".safetensors"):
            start = max(len(head), size - TAIL_BYTES)
            if start < size:
                parts.append((start, read(info.relkey, start, size - 1, info.etag)))
        return parts


def _prune_empty(root: Path) -> None:
    """Remove folders left empty (a checkpoint deleted from the store disappears from the mirror)."""
    for folder, _, names in os.walk(root, topdown=False):
        if folder != str(root) and not names:
            try:
                Path(folder).rmdir()  # refused while a sub-folder is still there: that one holds files
            except OSError:
                continue


def _remove_tree(folder: Path) -> None:
    for inner, _, names in os.walk(folder, topdown=False):
        for name in names:
            (Path(inner) / name).unlink(missing_ok=True)
        Path(inner).rmdir()
