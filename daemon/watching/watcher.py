"""watchdog observers on the run roots: every event becomes a hint for the main loop, nothing more.

Only the depth evald needs is watched, each folder on its own (``recursive=False``): the run root, where a
checkpoint folder, a container (a DeepSpeed ``save_dir``) or a tracker file (``latest``) appears, and each
folder directly in it, where a checkpoint's files are written and a container's tags and ``latest`` appear.
A recursive watch walks the whole tree below the root when it is set up and again on every folder created
or moved in, so a folder nested thousands deep inside one checkpoint stopped the daemon at start (a
``RecursionError`` in the walk) and, made while it ran, killed the watch of every checkpoint. What happens
deeper (a verl ``actor/huggingface/`` shard, a container's tag being filled) is seen by the quiet-period
re-looks and the rescan, which need no event: events only make a look sooner.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import ObservedWatch

from daemon.watching.folders import top_level_child
from inference import layouts

log = structlog.get_logger("evald.watcher")

Hint = tuple[str, Path]

#: The most folders in one run root watched on their own; beyond, the rest are left to the rescan (said
#: once). Trainers keep a handful of checkpoints; a root holding thousands of folders is not a run.
MAX_CHILD_WATCHES = 1024


class _Handler(FileSystemEventHandler):
    def __init__(self, run: str, root: Path, hints: queue.SimpleQueue[Hint], wake: threading.Event) -> None:
        self._run = run
        self._root = root
        self._hints = hints
        self._wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if not raw:
                continue
            # fsdecode: a name that is not UTF-8 keeps its bytes (surrogateescape) instead of raising here.
            path = Path(raw if isinstance(raw, str) else os.fsdecode(raw))
            child = top_level_child(self._root, path)
            if child is not None:
                self._hints.put((self._run, child))
                self._wake.set()


class _OverflowAlarm(logging.Handler):
    """Turns watchdog's "queue overflowed" warning into a rescan request.

    watchdog rebuilds its watches after an IN_Q_OVERFLOW but the events in between are gone, and it says
    so only in that log record; a rescan is what finds whatever they were about.
    """

    def __init__(self, on_overflow: Callable[[], None]) -> None:
        super().__init__(level=logging.WARNING)
        self._on_overflow = on_overflow

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in str(record.msg).lower():
            self._on_overflow()


def watched_children(root: Path, limit: int = MAX_CHILD_WATCHES) -> tuple[list[Path], bool]:
    """The folders directly in ``root`` worth a watch of their own (not hidden nor being written), at
    most ``limit`` in name order, and whether there were more. Nothing below them is listed."""
    found: list[Path] = []
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):  # gone or unreadable since: the rescan names it
                    if not layouts.is_ignored_name(entry.name) and entry.is_dir(follow_symlinks=False):
                        found.append(Path(entry.path))
    except OSError:
        return [], False
    found.sort()
    return found[:limit], len(found) > limit


class Watcher:
    """A watch on each run root and on each folder directly in it; roots that do not exist yet are retried
    by ``refresh``.

    Any failure of inotify (the watch limit, a dead emitter thread, a queue overflow, any error watchdog
    raises) falls back to the periodic rescan with a warning, and ``overflowed`` asks the caller for a
    rescan now.
    """

    def __init__(self, roots: dict[str, Path], wake: threading.Event) -> None:
        self._roots = roots
        self._wake = wake
        self.hints: queue.SimpleQueue[Hint] = queue.SimpleQueue()
        self.overflowed = threading.Event()
        self._observer = Observer()
        self._watches: dict[str, ObservedWatch] = {}
        #: Per run, the watches of the folders directly in its root.
        self._children: dict[str, dict[Path, ObservedWatch]] = {run: {} for run in roots}
        self._limited: set[str] = set()
        self._alarm = _OverflowAlarm(self._overflow)

    def _overflow(self) -> None:
        log.warning("watcher.overflow", action="rescan")
        self.overflowed.set()
        self._wake.set()

    def start(self) -> None:
        for name in ("watchdog.observers.inotify", "watchdog.observers.inotify_c"):
            logging.getLogger(name).addHandler(self._alarm)
        self._observer.start()
        self.refresh()

    def refresh(self) -> None:
        """Watch roots and folders that appeared, forget those that went, and notice watches that died
        (they fall back to the rescan)."""
        alive = {emitter.watch for emitter in self._observer.emitters if emitter.is_alive()}
        for run, watch in list(self._watches.items()):
            if watch not in alive:
                log.warning("watcher.lost", run=run, fallback="rescan")
                self._unschedule(watch)
                del self._watches[run]
        for run, root in self._roots.items():
            if run not in self._watches and root.is_dir():
                started = self._schedule(run, root, root)
                if started is None:
                    continue
                self._watches[run] = started
                log.info("watcher.started", run=run, root=str(root))
            if run in self._watches:
                self._refresh_children(run, root, alive)

    def _refresh_children(self, run: str, root: Path, alive: set[ObservedWatch]) -> None:
        children = self._children[run]
        present, more = watched_children(root)
        keep = set(present)
        for path, watch in list(children.items()):
            if path not in keep or watch not in alive:
                self._unschedule(watch)
                del children[path]
        for path in present:
            self._watch_child(run, path)
        if more and run not in self._limited:
            self._limited.add(run)
            log.warning(
                "watcher.limited", run=run, root=str(root), watched=MAX_CHILD_WATCHES, fallback="rescan"
            )

    def _watch_child(self, run: str, path: Path) -> None:
        children = self._children[run]
        if path in children or len(children) >= MAX_CHILD_WATCHES:
            return
        watch = self._schedule(run, self._roots[run], path)
        if watch is not None:
            children[path] = watch

    def _schedule(self, run: str, root: Path, folder: Path) -> ObservedWatch | None:
        try:
            return self._observer.schedule(_Handler(run, root, self.hints, self._wake), str(folder))
        except Exception as exc:
            # The inotify watch limit, a folder that vanished, whatever else watchdog raises: the periodic
            # rescan still finds them.
            log.warning(
                "watcher.unavailable",
                run=run,
                root=str(root),
                folder=str(folder),
                error=f"{type(exc).__name__}: {exc}",
                fallback="rescan",
            )
            return None

    def _unschedule(self, watch: ObservedWatch) -> None:
        with contextlib.suppress(Exception):
            self._observer.unschedule(watch)

    def drain(self) -> set[Hint]:
        """The hints since the last call; a folder they name that is not watched yet gets its watch."""
        found: set[Hint] = set()
        while True:
            try:
                found.add(self.hints.get_nowait())
            except queue.Empty:
                break
        for run, path in found:
            if run in self._watches and path not in self._children[run] and _is_plain_dir(path):
                self._watch_child(run, path)
        return found

    def stop(self) -> None:
        for name in ("watchdog.observers.inotify", "watchdog.observers.inotify_c"):
            logging.getLogger(name).removeHandler(self._alarm)
        self._observer.stop()
        self._observer.join(timeout=5)


def _is_plain_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink() and not layouts.is_ignored_name(path.name)
    except OSError:
        return False
