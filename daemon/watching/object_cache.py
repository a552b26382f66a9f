"""Downloaded copies of ``s3://`` checkpoints: fetched once, in parallel ranged GETs, checked, bounded.

A due checkpoint of an ``s3://`` run is recorded under the run's mirror (:mod:`daemon.watching.mirror`),
which holds only what readiness reads. Before its worker starts, :func:`local_copy` downloads the
checkpoint's objects (and the trackers beside it, such as DeepSpeed's ``latest``) into
``[runs.s3] cache_dir``/copies, and the worker loads that folder as any local checkpoint.

Every object is fetched in ``chunk_mb`` ranged GETs, ``max_concurrency`` at a time across all the
checkpoint's files, each pinned to the ETag the listing gave (``If-Match``), so an object replaced
mid-download fails the copy instead of mixing two uploads. Each file is then checked against its size
and, where the ETag is a content digest, against it: a single-part upload's ETag is the MD5 of its bytes,
a multipart upload's the MD5 of its parts' MD5s (the part size asked of the store), hashed as the chunks
arrive (:class:`StreamDigest`), so no file is read twice. A copy is written
under a temporary name and renamed into place complete, with a manifest beside it; a later job of the same
checkpoint (another task, a retry) reuses it while the store still lists the same objects.

Each job that uses a copy pins it (a file under ``cache_dir/pins`` named by the job's claim): a pinned
copy is never evicted. The runner releases a claim's pin once the claim is over
(:mod:`daemon.running.fetches`), and evicts the copy then unless another job of the same checkpoint still
waits for it: copies are evicted after use, and, least recently used first, when a new one needs room
within ``cache_max_gb``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import structlog

from daemon.config import RunConfig
from daemon.config.object_store import S3Config
from daemon.errors import EvaldError
from daemon.watching.folders import TRACKER_FILES
from daemon.watching.listing import files_under
from daemon.watching.objects import ObjectGone, ObjectInfo, Store, StoreError

log = structlog.get_logger("evald.objects")

MANIFEST_SUFFIX = ".evald-copy.json"
PINS = "pins"
_GB = 1024**3
#: Tries of one ranged GET (the store's retries are off: see :mod:`daemon.watching.objects`).
CHUNK_TRIES = 4


class CopyFailed(EvaldError):
    """A checkpoint could not be downloaded (the store away, an object changed, the cache too small)."""

    def __init__(
        self, message: str, *, transient: bool, vanished: bool = False, corrupt: bool = False
    ) -> None:
        super().__init__(message)
        #: The store away, refusing, or an object replaced mid-download: the job waits and tries again.
        self.transient = transient
        #: The checkpoint was deleted from the store.
        self.vanished = vanished
        #: The bytes downloaded do not hash to the store's ETag: a torn transfer, a corrupt object or a
        #: store whose ETags are no MD5s. Each such download spends one of the job's attempts: retried
        #: for free, a persistent mismatch downloaded a 1 GB checkpoint again and again, for ever.
        self.corrupt = corrupt


@dataclass(frozen=True)
class Chunk:
    info: ObjectInfo
    start: int
    end: int


def chunks(objects: list[ObjectInfo], chunk_bytes: int) -> list[Chunk]:
    """The ranged GETs that fetch ``objects`` (pure)."""
    found = []
    for info in objects:
        for start in range(0, info.size, chunk_bytes):
            found.append(Chunk(info, start, min(info.size, start + chunk_bytes) - 1))
    return found


class StreamDigest:
    """An S3 ETag computed over a file's chunks as they arrive, in any order: each is hashed once the bytes
    before it are in, so a downloaded file is never read a second time. A single-part upload's ETag is the
    MD5 of its bytes; a multipart upload's the MD5 of its parts' MD5s, then ``-`` and their count."""

    def __init__(self, etag: str, part_size: int | None) -> None:
        self.etag = etag
        whole, _, count = etag.partition("-")
        plain = len(etag) == 32 and not count
        multipart = len(whole) == 32 and count.isdigit() and part_size is not None and part_size > 0
        self._whole = hashlib.md5(usedforsecurity=False) if plain else None
        self._part_size = part_size if multipart else None
        #: Whether the ETag is a digest this can check (not an SSE-KMS one, a part size known).
        self.checkable = plain or multipart
        self._digests: list[bytes] = []
        self._part = hashlib.md5(usedforsecurity=False)
        self._in_part = 0
        self._next = 0
        self._pending: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def add(self, start: int, data: bytes) -> None:
        if not self.checkable:
            return
        with self._lock:
            if start < self._next:
                return  # a retried range: these bytes were hashed already
            self._pending[start] = data
            while self._next in self._pending:
                block = self._pending.pop(self._next)
                self._consume(block)
                self._next += len(block)

    def _consume(self, block: bytes) -> None:
        if self._whole is not None:
            self._whole.update(block)
            return
        size = self._part_size or 1
        view = memoryview(block)
        while view:
            take = min(len(view), size - self._in_part)
            self._part.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == size:
                self._digests.append(self._part.digest())
                self._part, self._in_part = hashlib.md5(usedforsecurity=False), 0

    def computed(self) -> str | None:
        """The ETag of the bytes seen, in the store's form; ``None`` when it is no digest this can check
        or a chunk never came."""
        if not self.checkable or self._pending:
            return None
        if self._whole is not None:
            return self._whole.hexdigest()
        digests = self._digests + ([self._part.digest()] if self._in_part else [])
        combined = hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest()
        return f"{combined}-{len(digests)}"

    def matches(self) -> bool | None:
        """Whether the bytes match the ETag; ``None`` when it is no digest this can check."""
        if not self.checkable:
            return None
        return self.computed() == self.etag  # a hole (a chunk never came) matches nothing


def etag_digest(path: Path, etag: str, part_size: int | None) -> bool | None:
    """Whether ``path``'s bytes match an S3 ETag (:class:`StreamDigest` over the file)."""
    digest = StreamDigest(etag, part_size)
    offset = 0
    with path.open("rb") as handle:
        while block := handle.read(8 * 1024 * 1024):
            digest.add(offset, block)
            offset += len(block)
    return digest.matches()


def manifest_path(copy: Path) -> Path:
    return copy.with_name(copy.name + MANIFEST_SUFFIX)


def _manifest(objects: list[ObjectInfo]) -> dict[str, list[object]]:
    return {o.relkey: [o.size, o.etag] for o in objects}


@dataclass(frozen=True)
class Pin:
    """A job's hold on a copy: ``key`` names the claim, ``checkpoint`` is its path in the run's mirror."""

    key: str
    copy: Path
    checkpoint: str


def _listed(store: Store, name: str) -> tuple[list[ObjectInfo], list[ObjectInfo]]:
    """The checkpoint's objects and the trackers beside it (``latest``), as the store lists them now."""
    try:
        objects = store.listing(name)
        beside = store.listing(name.rpartition("/")[0], direct=True)
    except StoreError as exc:
        raise CopyFailed(f"cannot list {store.url}/{name}: {exc}", transient=True) from exc
    if not objects:
        raise CopyFailed(
            f"{store.url}/{name} holds no objects any more (deleted from the store)",
            transient=False,
            vanished=True,
        )
    return objects, [o for o in beside if o.relkey.rsplit("/", 1)[-1] in TRACKER_FILES]


def local_copy(
    run: RunConfig, checkpoint: Path, *, pin: str | None = None, stop: threading.Event | None = None
) -> Path:
    """The downloaded copy of the ``s3://`` checkpoint recorded at ``checkpoint`` (a path in the run's
    mirror), fetching it unless a valid one is cached; :class:`CopyFailed` saying why it cannot be.
    ``pin``: the claim that will use it, which holds it until :func:`release`; ``stop`` set: the download
    ends early (as a transient failure)."""
    if run.url is None or run.s3 is None:
        return checkpoint
    name = run.s3.name_in_mirror(run.url, checkpoint)
    if name is None:
        raise CopyFailed(
            f"{checkpoint} is in no mirror of {run.url}: not one of its checkpoints", transient=False
        )
    store = _store(run.url, run.s3)
    copies = run.s3.copy_root(run.url)
    target = copies / name
    copies.mkdir(parents=True, exist_ok=True)
    with _locked(run.s3.cache_dir / "copies.lock"):
        if pin is not None:
            # Pinned before anything is evicted or downloaded: no other job's room-making removes it.
            _write_pin(run.s3.cache_dir, Pin(pin, target, str(checkpoint)))
        objects, trackers = _listed(store, name)
        wanted = _manifest(objects + trackers)
        manifest = manifest_path(target)
        if target.is_dir() and manifest.is_file() and _read_manifest(manifest) == wanted:
            os.utime(manifest)  # most recently used
            log.info("objects.copy_reused", run=run.name, checkpoint=name, path=str(target))
            return target
        size = sum(o.size for o in objects + trackers)
        limit = int(run.s3.cache_max_gb * _GB)
        if size > limit:
            raise CopyFailed(
                f"{store.url}/{name} is {size / _GB:.2f} GB, more than"
                f" cache_max_gb = {run.s3.cache_max_gb:g}",
                transient=False,
            )
        _evict(copies, room=limit - size, keep=target, pinned=pinned_copies(run.s3.cache_dir))
        started = time.monotonic()
        _download(store, objects, trackers, name, target, stop)
        manifest.write_text(json.dumps(wanted))
        secs = time.monotonic() - started
        log.info(
            "objects.copied",
            run=run.name,
            checkpoint=name,
            path=str(target),
            bytes=size,
            secs=round(secs, 3),
            mb_per_sec=round(size / 1e6 / max(secs, 1e-9), 1),
        )
        return target


_STORES: dict[tuple[str, str], Store] = {}


def _store(url: str, settings: S3Config) -> Store:
    """One store (and client, with its connection pool) per run and settings, reused across jobs."""
    key = (url, settings.model_dump_json())
    if key not in _STORES:
        _STORES[key] = Store(settings, url)
    return _STORES[key]


def _fetch_all(
    store: Store, infos: list[ObjectInfo], placed: dict[str, Path], stop: threading.Event | None
) -> dict[str, StreamDigest]:
    """Every object's bytes into its file (made at its full size, filled chunk by chunk in parallel), and
    the digest of each as it came."""
    settings = store.settings
    handles = {}
    try:
        for info in infos:
            path = placed[info.relkey]
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = path.open("wb")
            handles[info.relkey] = handle
            handle.truncate(info.size)
        digests = {
            info.relkey: StreamDigest(
                info.etag if settings.verify_etags else "",
                store.part_size(info.relkey) if settings.verify_etags and "-" in info.etag else None,
            )
            for info in infos
        }
        work = chunks(infos, settings.chunk_mb * 1024 * 1024)
        with ThreadPoolExecutor(settings.max_concurrency, thread_name_prefix="evald-copy") as pool:
            for _ in pool.map(
                lambda c: _fetch(store, c, handles[c.info.relkey].fileno(), digests[c.info.relkey], stop),
                work,
            ):
                pass
    finally:
        for handle in handles.values():
            handle.close()
    return digests


def _download(
    store: Store,
    objects: list[ObjectInfo],
    trackers: list[ObjectInfo],
    name: str,
    target: Path,
    stop: threading.Event | None = None,
) -> None:
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    prefix = f"{name}/"
    placed: dict[str, Path] = {}
    for info in objects:
        placed[info.relkey] = staging / "checkpoint" / info.relkey.removeprefix(prefix)
    for info in trackers:
        placed[info.relkey] = staging / "beside" / info.relkey.rsplit("/", 1)[-1]
    try:
        digests = _fetch_all(store, objects + trackers, placed, stop)
        for info in objects + trackers:
            _check(info, placed[info.relkey], digests[info.relkey])
        (staging / "checkpoint").mkdir(exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        (staging / "checkpoint").rename(target)
        for info in trackers:
            # Trackers go beside the copy, where layouts look for them (``latest``).
            placed[info.relkey].replace(target.parent / placed[info.relkey].name)
    except ObjectGone as exc:
        raise CopyFailed(
            f"downloading {store.url}/{name}: an object was deleted: {exc}", transient=False, vanished=True
        ) from exc
    except StoreError as exc:
        raise CopyFailed(
            f"downloading {store.url}/{name}: {type(exc).__name__}: {exc}", transient=True
        ) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch(
    store: Store, chunk: Chunk, descriptor: int, digest: StreamDigest, stop: threading.Event | None
) -> None:
    if stop is not None and stop.is_set():
        raise CopyFailed(f"downloading {store.url}/{chunk.info.relkey}: stopped", transient=True)

    def sink(offset: int, data: bytes) -> None:
        os.pwrite(descriptor, data, offset)
        digest.add(offset, data)

    store.read_into(chunk.info.relkey, chunk.start, chunk.end, chunk.info.etag, sink)


def _check(info: ObjectInfo, path: Path, digest: StreamDigest) -> None:
    size = path.stat().st_size
    if size != info.size:
        raise CopyFailed(
            f"{info.relkey}: {size} bytes downloaded, the store lists {info.size}", transient=True
        )
    if digest.matches() is False:
        raise CopyFailed(
            f"{info.relkey}: the downloaded bytes hash to {digest.computed()}, the store's ETag is "
            f"{info.etag} (a corrupt object or transfer, or a store whose ETags are not MD5s of the bytes: "
            "then set s3.verify_etags = false)",
            transient=False,
            corrupt=True,
        )


def _read_manifest(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def copies_in(folder: Path) -> list[tuple[float, int, Path]]:
    """(last used, bytes, copy folder) of every complete copy under ``folder``, oldest first."""
    found = []
    for manifest, info in files_under(folder, MANIFEST_SUFFIX):
        copy = manifest.with_name(manifest.name.removesuffix(MANIFEST_SUFFIX))
        used = info.st_mtime
        try:
            content = json.loads(manifest.read_text())
            size = sum(int(v[0]) for v in content.values())
        except (OSError, ValueError, TypeError, IndexError):
            used, size = 0.0, 0  # gone or torn since it was listed: removed first
        found.append((used, size, copy))
    return sorted(found, key=lambda item: (item[0], str(item[2])))


def _evict(folder: Path, *, room: int, keep: Path, pinned: set[Path]) -> None:
    """Remove the least recently used copies no job holds until the rest take at most ``room`` bytes;
    :class:`CopyFailed` (transient: the jobs holding them end) when the held ones alone leave no room."""
    present = [c for c in copies_in(folder) if c[2] != keep]
    total = sum(size for _, size, _ in present)
    for _, size, copy in present:
        if total <= room:
            return
        if copy in pinned:
            continue
        _remove(copy)
        total -= size
        log.info("objects.evicted", path=str(copy), bytes=size, reason="room")
    if total > room:
        raise CopyFailed(
            f"the cache holds {total / _GB:.2f} GB of copies that running jobs use; waiting for room"
            f" (cache_max_gb is too small for this many at once)",
            transient=True,
        )


def _remove(copy: Path) -> None:
    shutil.rmtree(copy, ignore_errors=True)
    manifest_path(copy).unlink(missing_ok=True)


# --- pins: which jobs use which copy ------------------------------------------------------------------


def _pin_path(cache_dir: Path, key: str) -> Path:
    return cache_dir / PINS / f"{key}.json"


def _write_pin(cache_dir: Path, pin: Pin) -> None:
    path = _pin_path(cache_dir, pin.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps({"copy": str(pin.copy), "checkpoint": pin.checkpoint}))
    staging.replace(path)


def pins(cache_dir: Path) -> list[Pin]:
    """Every job's hold on a copy in ``cache_dir`` (an unreadable pin file holds nothing)."""
    found = []
    folder = cache_dir / PINS
    if not folder.is_dir():
        return []
    for path in sorted(folder.glob("*.json")):
        try:
            content = json.loads(path.read_text())
            found.append(Pin(path.stem, Path(content["copy"]), str(content["checkpoint"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def pinned_copies(cache_dir: Path) -> set[Path]:
    return {pin.copy for pin in pins(cache_dir)}


def release(cache_dir: Path, key: str) -> None:
    """The claim ``key`` no longer uses its copy."""
    _pin_path(cache_dir, key).unlink(missing_ok=True)


def evict_unused(cache_dir: Path, copy: Path) -> Literal["evicted", "held", "busy"]:
    """Remove ``copy`` unless a job holds it (``held``); ``busy`` when a download holds the cache now
    (never waited for: the daemon's loop calls this), to be tried again."""
    with _locked(cache_dir / "copies.lock", wait=False) as free:
        if not free:
            return "busy"
        if copy in pinned_copies(cache_dir):
            return "held"
        size = sum(info.st_size for _, info in files_under(copy))
        if copy.exists() or manifest_path(copy).exists():
            _remove(copy)
            log.info("objects.evicted", path=str(copy), bytes=size, reason="used")
        return "evicted"


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """One download (or eviction) at a time per cache folder, whichever daemon (sharing the folder) asks;
    with ``wait=False`` it yields False at once when another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
