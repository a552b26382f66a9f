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

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

from daemon.watching.mirror import Mirror
from daemon.watching.objects import TRIES, ObjectInfo, Store, StoreError, StoreRefused
from daemon.watching.runs import WatchedRun

log = structlog.get_logger("evald.objects")

#: The suffix of the hidden file that stands, in the mirror, for a multipart upload in progress.
UPLOADING = ".uploading"

#: Why each paused run's store could not be used, by (run name, URL).
Paused = Mapping[tuple[str, str], str]


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
        """Whether run ``name``'s mirror may be judged now (a local run always may)."""
        entry = self._runs.get(name)
        return entry is None or entry.in_step

    def sync(self, name: str) -> bool:
        """List run ``name``'s prefix and update its mirror; whether the run may be judged this pass."""
        entry = self._runs[name]
        started = time.monotonic()
        try:
            # While the store is away, one try per rescan: the loop is held for one timeout at most.
            tries = 1 if entry.problem is not None or entry.carried is not None else TRIES
            listed = entry.store.listing(tries=tries)
            listed_secs = time.monotonic() - started
            listed += self._uploads(name, entry, tries)
            changes, outcome = entry.mirror.apply(listed)
        except StoreError as exc:
            self._failed(name, entry, exc)
            return False
        except OSError as exc:
            # The local cache folder (full, unwritable): the run waits like an unreachable store.
            self._failed(name, entry, exc)
            return False
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
            objects=len(listed),
            list_secs=round(listed_secs, 3),
            written=outcome.written,
            deleted=outcome.deleted,
            unsettled=len(outcome.unsettled),
        )
        return entry.in_step

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
