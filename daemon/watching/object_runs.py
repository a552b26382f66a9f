"""The runs whose root is ``s3://``: each rescan lists the prefix and brings the run's mirror in step.

Discovery then judges the mirror as any local root. A run is judged only after a pass that completed: a
listing cut short (the store away mid-way) or an object replaced while it was read leaves the run as the
last complete pass saw it, so nothing is recorded, lost or judged from half a listing. The store being
away is said once per outage (``objects.unavailable``, then ``objects.recovered``), retried at every
rescan; credentials or permissions refused pause the run with one error line naming it and the
variables it reads (``objects.refused``): the other runs go on, and the run resumes by itself once the
store accepts it (``objects.recovered``).

A reload (SIGHUP) builds new :class:`ObjectRuns`: a run still paused then says so once more, as the
answer to the reload, and one the reload mended says ``objects.recovered`` as if the store had.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from daemon.watching.mirror import Mirror, Outcome, Plan
from daemon.watching.objects import TRIES, ObjectInfo, Store, StoreError, StoreRefused
from daemon.watching.runs import WatchedRun

log = structlog.get_logger("evald.objects")

#: The suffix of the hidden file that stands, in the mirror, for a multipart upload in progress.
UPLOADING = ".uploading"

#: Why each paused run's store could not be used, by (run name, URL).
Paused = Mapping[tuple[str, str], str]
#: The longest a pass waits for the listing it starts (see :meth:`ObjectRuns.sync`).
WAIT_SECS = 2.0

T = TypeVar("T")


@dataclass
class ObjectRun:
    store: Store
    mirror: Mirror
    #: Whether the last pass completed: only then are the run's candidates judged.
    in_step: bool = False
    #: Why the store cannot be used now (logged once), or None while it answers.
    problem: str | None = None
    #: Why the store could not be used when a reload replaced the run's last entry (said there), or None.
    carried: str | None = None
    #: Keys already said to be refused (unsafe names), so each is said once.
    refused_keys: frozenset[str] = frozenset()
    #: Whether uploads in progress can be listed (a policy may allow listing objects but not those).
    sees_uploads: bool = True
    #: The listing under way on its thread: (objects listed, seconds, the mirror's changes and outcome).
    listing: Future[tuple[int, float, Plan, Outcome]] | None = None


def _in_thread(call: Callable[[], T], name: str) -> Future[T]:
    """``call()`` on a daemon thread of its own (a listing hung on a stopped store never holds the
    process's exit, as a pool's worker would)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(call())
        except BaseException as exc:  # handed to the loop, which says it
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


#: One lock per mirror folder in this process: listings of one root (a reload's and the one it replaced)
#: never write its mirror at once.
_MIRROR_LOCKS: dict[Path, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _mirror_lock(root: Path) -> threading.Lock:
    with _LOCKS_LOCK:
        return _MIRROR_LOCKS.setdefault(root, threading.Lock())


class ObjectRuns:
    """The ``s3://`` runs among the watched ones, by run name."""

    def __init__(
        self,
        runs: Iterable[WatchedRun],
        environ: Mapping[str, str] | None = None,
        paused: Paused | None = None,
    ) -> None:
        """``paused``: what the :class:`ObjectRuns` a reload replaces knew (:meth:`paused`), so that the
        pause the reload mends is said to be over and a store still away holds the reload for one try,
        not the first rescan's three."""
        self._runs: dict[str, ObjectRun] = {}
        for run in runs:
            config = run.config
            if config.url is None or config.s3 is None:
                continue
            store = Store(config.s3, config.url, environ)
            mirror = Mirror(store, config.root, config.s3.cache_dir / "tmp")
            carried = (paused or {}).get((config.name, config.url))
            self._runs[config.name] = ObjectRun(store, mirror, carried=carried)

    def paused(self) -> Paused:
        """Why each paused run's store could not be used, for the :class:`ObjectRuns` of a reload (a run
        the reload removes is forgotten)."""
        return {
            (name, entry.store.url): why
            for name, entry in self._runs.items()
            if (why := entry.problem or entry.carried) is not None
        }

    def __contains__(self, name: object) -> bool:
        return name in self._runs

    def judged(self, name: str) -> bool:
        """Whether run ``name``'s mirror may be judged now (a local run always may): its last listing
        completed and none is being applied."""
        entry = self._runs.get(name)
        return entry is None or (entry.in_step and entry.listing is None)

    def sync(self, name: str) -> bool:
        """Bring run ``name``'s mirror in step with its store; whether the run may be judged this pass.

        The listing and the mirror's downloads run on a thread of their own, never on the loop: a pass
        waits for the one it starts at most :data:`WAIT_SECS` (a store that answers is in step in the same
        pass), and one still out then is taken up by a later pass. While it is out the run is not judged
        (:meth:`judged`), so its mirror is never read while it is written. A store that hangs (a stopped
        endpoint, three tries of ``timeout_secs`` each) so holds the loop ``WAIT_SECS`` per rescan at
        most, where it held every run's pass for the whole listing.
        """
        entry = self._runs[name]
        if entry.listing is not None and entry.listing.done():
            self._take(name, entry)
        if entry.listing is None:
            # While the store is away, one try per rescan: its thread is held for one timeout at most.
            tries = 1 if entry.problem is not None or entry.carried is not None else TRIES
            entry.listing = _in_thread(lambda: self._list(name, entry, tries), f"evald-list-{name}")
            wait([entry.listing], timeout=WAIT_SECS)
            self._take(name, entry)
        return self.judged(name)

    def _take(self, name: str, entry: ObjectRun) -> None:
        """The finished listing's outcome, if it finished: said and kept."""
        listing = entry.listing
        if listing is None or not listing.done():
            return
        entry.listing = None
        try:
            listed, listed_secs, changes, outcome = listing.result()
        except (StoreError, OSError) as exc:
            # OSError: the local cache folder (full, unwritable): the run waits like an unreachable store.
            self._failed(name, entry, exc)
            return
        was = entry.problem or entry.carried
        if was is not None:
            log.info("objects.recovered", run=name, url=entry.store.url, was=was)
            entry.problem = entry.carried = None
        for key, why in changes.refused:
            if key not in entry.refused_keys:
                log.warning("objects.key_refused", run=name, key=key, reason=why, action="not mirrored")
        entry.refused_keys = frozenset(k for k, _ in changes.refused)
        entry.in_step = not outcome.unsettled
        log.debug(
            "objects.listed",
            run=name,
            objects=listed,
            list_secs=round(listed_secs, 3),
            written=outcome.written,
            deleted=outcome.deleted,
            unsettled=len(outcome.unsettled),
        )

    def _list(self, name: str, entry: ObjectRun, tries: int) -> tuple[int, float, Plan, Outcome]:
        """List the prefix and apply it to the mirror (on the listing's thread): the mirror's folder is
        locked meanwhile, so a reload's new listing of the same root waits for the old one."""
        with _mirror_lock(entry.mirror.root):
            started = time.monotonic()
            listed = entry.store.listing(tries=tries)
            listed_secs = time.monotonic() - started
            listed += self._uploads(name, entry, tries)
            changes, outcome = entry.mirror.apply(listed)
        return len(listed), listed_secs, changes, outcome

    @staticmethod
    def _uploads(name: str, entry: ObjectRun, tries: int) -> list[ObjectInfo]:
        """Each multipart upload in progress, as a hidden file growing beside where the object will be
        (``.model-00002-of-00002.safetensors.uploading``): its bytes so far and the time of its last part.
        So an upload that goes on keeps its checkpoint changing, as a file being written does locally, and
        one that stalls for ``invalid_after_secs`` is given up on, as a stalled local write is."""
        if not entry.sees_uploads:
            return []
        try:
            uploads = entry.store.uploads(tries=tries)
        except StoreRefused as exc:
            entry.sees_uploads = False
            log.warning(
                "objects.uploads_hidden",
                run=name,
                url=entry.store.url,
                error=str(exc),
                consequence="an upload slower than invalid_after_secs may be given up on: allow"
                " s3:ListBucketMultipartUploads and s3:ListMultipartUploadParts",
            )
            return []
        found = []
        for upload in uploads:
            folder, _, file = upload.relkey.rpartition("/")
            hidden = f"{folder}/.{file}{UPLOADING}" if folder else f".{file}{UPLOADING}"
            found.append(ObjectInfo(hidden, upload.size, upload.mtime_ns, ""))
        # Two uploads of one key at once (a retry while the first is not aborted): the latest counts.
        latest: dict[str, ObjectInfo] = {}
        for info in sorted(found, key=lambda i: i.mtime_ns):
            latest[info.relkey] = info
        return list(latest.values())

    def _failed(self, name: str, entry: ObjectRun, exc: Exception) -> None:
        entry.in_step = False
        problem = f"{type(exc).__name__}: {exc}"
        if entry.problem is not None:
            entry.problem = problem
            return
        entry.problem = problem
        if isinstance(exc, StoreRefused):
            log.error(
                "objects.refused",
                run=name,
                url=entry.store.url,
                credentials=entry.store.variables,
                error=str(exc),
                action="run paused: fix the credentials or the bucket's policy; retried at every rescan",
            )
        else:
            log.warning(
                "objects.unavailable",
                run=name,
                url=entry.store.url,
                error=problem,
                action="retried at every rescan; nothing is judged from a partial listing",
            )
