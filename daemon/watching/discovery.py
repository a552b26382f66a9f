"""Finds checkpoints under each run's root and turns the ready ones into pending jobs.

Filesystem events and rescans only say *where to look*; what a directory is, and whether it is complete,
is decided from what is on disk at the time of the look. A directory's snapshot must stay equal for the
quiet period, which needs no event at all, so missed or coalesced events delay a checkpoint, never let a
half-written one through.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.config import RunConfig, SchedulingConfig
from daemon.watching.readiness import Decision, Outcome, decide
from inference import layouts
from inference.layouts import Readiness, Snapshot, Verdict
from storage import queries
from storage.database import Database
from storage.models import CheckpointState

log = structlog.get_logger("evald.discovery")


@dataclass(frozen=True)
class WatchedRun:
    config: RunConfig
    run_id: int
    tasks: tuple[str, ...]

    @property
    def settings(self) -> layouts.LayoutSettings:
        return self.config.layout_settings()


@dataclass
class _Candidate:
    snapshot: Snapshot
    stable_since: float
    recorded: bool = False
    last_reason: str = ""


@dataclass
class _RunState:
    run: WatchedRun
    #: Checkpoints whose fate is settled (ready, invalid, vanished): never looked at again.
    settled: set[str] = field(default_factory=set)
    candidates: dict[str, _Candidate] = field(default_factory=dict)
    #: Checkpoints a previous daemon recorded as discovered; the first look after a restart starts their
    #: quiet period afresh.
    recorded: set[str] = field(default_factory=set)
    root_missing_logged: bool = False

    @cached_property
    def real_root(self) -> str:
        return os.path.realpath(self.run.config.root)


#: Files trainers keep beside their checkpoint folders to say which one is newest.
TRACKER_FILES = frozenset({"latest", "latest_checkpointed_iteration.txt"})


def _subdirs(folder: Path) -> list[Path]:
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p for p in entries if not layouts.is_ignored_name(p.name) and p.is_dir())


def is_container(folder: Path) -> bool:
    """A folder that holds checkpoint folders rather than being one (OpenRLHF's ``_actor``).

    Its name carries no step, it holds sub-folders, and its only files are trackers such as ``latest``.
    """
    if layouts.parse_step(folder.name) != (None, None):
        return False
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False
    has_subdir = False
    for entry in entries:
        if entry.is_dir():
            has_subdir = True
        elif entry.name not in TRACKER_FILES:
            return False
    return has_subdir


def candidate_dirs(root: Path) -> list[Path]:
    """The folders under a run root that could be checkpoints: its children, and a container's."""
    found: list[Path] = []
    for child in _subdirs(root):
        found.extend(_subdirs(child) if is_container(child) else [child])
    return found


def top_level_child(root: Path, path: Path) -> Path | None:
    """The child of ``root`` that an event at ``path`` concerns."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return None
    if not parts or layouts.is_ignored_name(parts[0]):
        return None
    return root / parts[0]


class Discovery:
    def __init__(
        self,
        database: Database,
        runs: Iterable[WatchedRun],
        scheduling: SchedulingConfig,
        clock: Callable[[], float] = time.monotonic,
        after_ready: Callable[[], int] | None = None,
    ) -> None:
        self._db = database
        #: Plans what became ready (the frequency policy) and returns how many jobs that created.
        self._after_ready = after_ready
        self._scheduling = scheduling
        self._clock = clock
        self._runs: dict[str, _RunState] = {}
        #: Jobs created since the caller last reset it: the queue only needs a look when this moved.
        self.enqueued = 0
        self._discovered: list[tuple[_RunState, Path, str, str]] = []
        self._settled_any = False
        for run in runs:
            with database.session() as session:
                states = queries.checkpoint_states(session, run.run_id)
            state = _RunState(run)
            for path, checkpoint_state in states.items():
                if checkpoint_state is CheckpointState.DISCOVERED:
                    state.recorded.add(path)
                else:
                    state.settled.add(path)
            self._runs[run.config.name] = state

    @contextmanager
    def _batched(self) -> Iterator[None]:
        """Newly discovered checkpoints are written in one transaction per pass, not one each: a restart
        over thousands of folders registers them in one commit."""
        try:
            yield
        finally:
            if self._discovered:
                batch = self._discovered
                rows = []
                for state, path, layout, reason in batch:
                    if str(path) in state.settled:
                        continue  # settled later in the same pass; its own write stands
                    step, epoch = self._step(path, layout)
                    rows.append(
                        queries.NewCheckpoint(
                            state.run.run_id, str(path), _name(state, path), step, epoch, layout, reason
                        )
                    )
                # Kept until written: with the database away the batch waits for the next pass.
                with self._db.session() as session:
                    queries.register_discovered(session, rows)
                self._discovered = []
            # Planned once per pass, in a transaction of its own: a crash in between leaves ready, unplanned
            # checkpoints, which the planner takes up at the next start. An invalid or vanished checkpoint
            # counts too: it may release newer ones held behind it.
            if self._settled_any and self._after_ready is not None:
                self.enqueued += self._after_ready()
                self._settled_any = False

    def scan(self) -> None:
        """Look at every directory under every root (the safety net under events)."""
        with self._batched():
            self._scan()

    def _scan(self) -> None:
        for state in self._runs.values():
            root = state.run.config.root
            if not root.is_dir():
                if not state.root_missing_logged:
                    log.warning("run.root_missing", run=state.run.config.name, root=str(root))
                    state.root_missing_logged = True
                continue
            state.root_missing_logged = False
            found = candidate_dirs(root)
            for path in found:
                if str(path) not in state.settled:
                    self._look(state, path)
            # Recorded ones deleted while nobody watched are marked vanished: left as discovered, they
            # would hold every newer checkpoint back from planning.
            present = {str(p) for p in found}
            for key in [*state.recorded, *state.candidates]:
                if key not in present and key not in state.settled:
                    self._look(state, Path(key))

    def hint(self, run_name: str, path: Path) -> None:
        """Something changed at or under ``path`` (a child of the run root): look at it now."""
        with self._batched():
            self._hint(run_name, path)

    def _hint(self, run_name: str, path: Path) -> None:
        state = self._runs.get(run_name)
        if state is None:
            return
        if path.is_dir() and is_container(path):
            targets = _subdirs(path) + [Path(k) for k in state.candidates if Path(k).parent == path]
        elif not path.is_dir() and str(path) not in state.candidates:
            # A tracker such as ``latest`` changed beside the checkpoints: it may complete any of them.
            targets = [Path(k) for k in state.candidates]
        else:
            targets = [path]
        for target in dict.fromkeys(targets):
            if str(target) not in state.settled:
                self._look(state, target)

    def tick(self) -> None:
        """Re-look at candidates whose quiet period or incomplete limit may have run out."""
        with self._batched():
            self._tick()

    def _tick(self) -> None:
        now = self._clock()
        quiet = self._scheduling.quiet_secs
        limit = self._scheduling.invalid_after_secs
        for state in self._runs.values():
            for key, candidate in list(state.candidates.items()):
                waited = now - candidate.stable_since
                if waited >= quiet or waited >= limit or state.run.config.marker is not None:
                    self._look(state, Path(key))

    def _look(self, state: _RunState, path: Path) -> None:
        key = str(path)
        run = state.run
        now = self._clock()
        if not _inside(state.real_root, path):
            self._settle(
                state, path, None, CheckpointState.INVALID, "symlink leaves the watched root", "refused"
            )
            return
        try:
            snapshot = layouts.take_snapshot(path)
        except (FileNotFoundError, NotADirectoryError):
            candidate = state.candidates.pop(key, None)
            if (candidate is not None and candidate.recorded) or key in state.recorded:
                self._settle(
                    state, path, None, CheckpointState.VANISHED, "deleted before it was complete", "vanished"
                )
            return
        candidate = state.candidates.get(key)
        if candidate is None or candidate.snapshot != snapshot:
            recorded = candidate.recorded if candidate else key in state.recorded
            candidate = _Candidate(snapshot, now, recorded=recorded)
            state.candidates[key] = candidate
        layout = layouts.detect(path, snapshot, run.config.layout)
        if layout is None:
            # Nothing recognisable yet; it stays a candidate. One recorded earlier whose files went (an
            # emptied folder) must not stay "discovered", holding every newer checkpoint back.
            if candidate.recorded and now - candidate.stable_since >= self._scheduling.invalid_after_secs:
                reason = "no recognisable checkpoint in it any more"
                self._settle(state, path, None, CheckpointState.INVALID, reason, "invalid")
            return
        marker = run.config.marker
        try:
            verdict = layouts.inspect(path, snapshot, layout, run.settings)
        except FileNotFoundError:
            verdict = Verdict(Readiness.INCOMPLETE, "a file disappeared while it was read")
        outcome = decide(
            verdict,
            quiet_for=now - candidate.stable_since,
            quiet_secs=self._scheduling.quiet_secs,
            invalid_after_secs=self._scheduling.invalid_after_secs,
            marker=marker,
            marker_present=marker is not None and marker in snapshot.names(),
        )
        self._act(state, path, layout, candidate, outcome)

    def _act(
        self, state: _RunState, path: Path, layout: str, candidate: _Candidate, outcome: Outcome
    ) -> None:
        if outcome.decision is Decision.READY:
            self._settle(state, path, layout, CheckpointState.READY, outcome.reason, "ready")
        elif outcome.decision is Decision.INVALID:
            self._settle(state, path, layout, CheckpointState.INVALID, outcome.reason, "invalid")
        else:
            if not candidate.recorded:
                self._discovered.append((state, path, layout, outcome.reason))
                candidate.recorded = True
                log.info("checkpoint.discovered", run=state.run.config.name, path=str(path), layout=layout)
            candidate.last_reason = outcome.reason

    def _settle(
        self, state: _RunState, path: Path, layout: str | None, new: CheckpointState, reason: str, event: str
    ) -> None:
        step, epoch = self._step(path, layout)
        # Written before it is forgotten: if the database is away, the candidate is still there to be
        # settled by a later pass.
        with self._db.session() as session:
            self._record_in(session, state, path, layout or "unknown", new, reason, step, epoch)
        state.candidates.pop(str(path), None)
        state.recorded.discard(str(path))
        state.settled.add(str(path))
        log_method = log.info if new is CheckpointState.READY else log.warning
        log_method(f"checkpoint.{event}", run=state.run.config.name, path=str(path), step=step, reason=reason)
        self._settled_any = True

    @staticmethod
    def _step(path: Path, layout: str | None) -> tuple[int | None, int | None]:
        if layout is not None and layout in layouts.REGISTRY:
            return layouts.get(layout).step(path)
        return layouts.parse_step(path.name)

    @staticmethod
    def _record_in(
        session: Session,
        state: _RunState,
        path: Path,
        layout: str,
        new: CheckpointState,
        reason: str,
        step: int | None,
        epoch: int | None,
    ) -> int:
        return queries.record_checkpoint(
            session,
            run_id=state.run.run_id,
            path=str(path),
            name=_name(state, path),
            step=step,
            epoch=epoch,
            layout=layout,
            state=new,
            reason=reason,
        )


def _name(state: _RunState, path: Path) -> str:
    """A checkpoint's name is its path under the run root (``_actor/global_step7``)."""
    root = state.run.config.root
    return str(path.relative_to(root)) if path.is_relative_to(root) else path.name


def _inside(real_root: str, path: Path) -> bool:
    """Whether ``path``, symlinks followed, stays under the (already resolved) run root."""
    real = os.path.realpath(path)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)
