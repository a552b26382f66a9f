"""watchdog observers on the run roots: every event becomes a hint for the main loop, nothing more."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import structlog
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from daemon.discovery import top_level_child

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
            path = Path(raw if isinstance(raw, str) else raw.decode())
            child = top_level_child(self._root, path)
            if child is not None:
                self._hints.put((self._run, child))
                self._wake.set()


class Watcher:
    """One recursive inotify watch per run root; roots that do not exist yet are retried by ``refresh``."""

    def __init__(self, roots: dict[str, Path], wake: threading.Event) -> None:
        self._roots = roots
        self._wake = wake
        self.hints: queue.SimpleQueue[Hint] = queue.SimpleQueue()
        self._observer = Observer()
        self._watched: set[str] = set()

    def start(self) -> None:
        self._observer.start()
        self.refresh()

    def refresh(self) -> None:
        for run, root in self._roots.items():
            if run in self._watched or not root.is_dir():
                continue
            try:
                self._observer.schedule(
                    _Handler(run, root, self.hints, self._wake), str(root), recursive=True
                )
            except OSError as exc:
                # inotify limits or a vanished root: the periodic rescan still finds checkpoints.
                log.warning("watcher.unavailable", run=run, root=str(root), error=str(exc))
                continue
            self._watched.add(run)
            log.info("watcher.started", run=run, root=str(root))

    def drain(self) -> set[Hint]:
        found: set[Hint] = set()
        while True:
            try:
                found.add(self.hints.get_nowait())
            except queue.Empty:
                return found

    def stop(self) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)
