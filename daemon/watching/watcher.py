"""watchdog observers on the run roots: every event becomes a hint for the main loop, nothing more."""

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

log = structlog.get_logger("evald.watcher")

Hint = tuple[str, Path]


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


class Watcher:
    """One recursive inotify watch per run root; roots that do not exist yet are retried by ``refresh``.

    Any failure of inotify (the watch limit, a dead emitter thread, a queue overflow) falls back to the
    periodic rescan with a warning, and ``overflowed`` asks the caller for a rescan now.
    """

    def __init__(self, roots: dict[str, Path], wake: threading.Event) -> None:
        self._roots = roots
        self._wake = wake
        self.hints: queue.SimpleQueue[Hint] = queue.SimpleQueue()
        self.overflowed = threading.Event()
        self._observer = Observer()
        self._watches: dict[str, ObservedWatch] = {}
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
        """Watch roots that appeared, and notice watches that died (they fall back to the rescan)."""
        alive = {emitter.watch for emitter in self._observer.emitters if emitter.is_alive()}
        for run, watch in list(self._watches.items()):
            if watch not in alive:
                log.warning("watcher.lost", run=run, fallback="rescan")
                with contextlib.suppress(KeyError, OSError):
                    self._observer.unschedule(watch)
                del self._watches[run]
        for run, root in self._roots.items():
            if run in self._watches or not root.is_dir():
                continue
            try:
                handler = _Handler(run, root, self.hints, self._wake)
                self._watches[run] = self._observer.schedule(handler, str(root), recursive=True)
            except OSError as exc:
                # The inotify watch limit, or a root that vanished: the periodic rescan still finds them.
                log.warning("watcher.unavailable", run=run, root=str(root), error=str(exc), fallback="rescan")
                continue
            log.info("watcher.started", run=run, root=str(root))

    def drain(self) -> set[Hint]:
        found: set[Hint] = set()
        while True:
            try:
                found.add(self.hints.get_nowait())
            except queue.Empty:
                return found

    def stop(self) -> None:
        for name in ("watchdog.observers.inotify", "watchdog.observers.inotify_c"):
            logging.getLogger(name).removeHandler(self._alarm)
        self._observer.stop()
        self._observer.join(timeout=5)
