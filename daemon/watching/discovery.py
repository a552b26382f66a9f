"""Finds checkpoints under each run's root and turns the ready ones into pending jobs.

Filesystem events and rescans only say *where to look*; what a directory is, and whether it is complete,
is decided from what is on disk at the time of the look. A directory's snapshot must stay equal for the
quiet period, which needs no event at all, so missed or coalesced events delay a checkpoint, never let a
half-written one through.

A folder is one item: whatever goes wrong while looking at it or recording it (a symlink loop, a step the
database cannot hold, a name it cannot store, an unreadable file) is that folder's problem. It is recorded
``invalid`` with the reason, or dropped with one error line when even that cannot be written, and the scan
goes on with the rest; only the database being away (:class:`DatabaseUnreachable`) holds a pass, and what
it held is written by a later one.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.config import RunConfig, SchedulingConfig
from daemon.watching import alternates, refusals
from daemon.watching.readiness import Decision, Outcome, decide
from inference import layouts
from inference.layouts import FileStat, Readiness, Snapshot, Verdict
from storage import queries
from storage.database import Database
from storage.database import reason as error_reason
from storage.errors import DatabaseUnreachable
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
    #: When it was first looked at (``stable_since`` restarts with every change).
    seen_since: float = 0.0


@dataclass(frozen=True)
class _Evaluated:
    """A checkpoint judged ready by this daemon, with its weight files as they were then: a rescan stats
    them (no read) to notice weights overwritten in place."""

    name: str
    step: int | None
    weights: tuple[FileStat, ...]


@dataclass
class _RunState:
    run: WatchedRun
    #: Checkpoints whose fate is settled (ready, invalid, vanished): never looked at again.
    settled: set[str] = field(default_factory=set)
    candidates: dict[str, _Candidate] = field(default_factory=dict)
    #: Checkpoints a previous daemon recorded as discovered; the first look after a restart starts their
    #: quiet period afresh.
    recorded: set[str] = field(default_factory=set)
    #: Folders a transient error (EIO, ESTALE, ...) keeps from being read: when it was first met. Looked
    #: at again by every rescan, logged once, refused once it has lasted ``invalid_after_secs``.
    unreadable: dict[str, float] = field(default_factory=dict)
    #: Folders that could be checkpoints and are not taken (yet), with why: logged once when first seen.
    ignored: dict[str, str] = field(default_factory=dict)
    #: Ready shapes of a step waiting for its preferred shape, still being written (waiter → awaited).
    waiting: dict[str, str] = field(default_factory=dict)
    #: Ready checkpoints whose weights each rescan stats, until one changes (said once) or goes.
    evaluated: dict[str, _Evaluated] = field(default_factory=dict)
    root_missing_logged: bool = False
    root_unreadable_logged: bool = False

    @cached_property
    def real_root(self) -> str:
        return os.path.realpath(self.run.config.root)


#: Files trainers keep beside their checkpoint folders to say which one is newest.
TRACKER_FILES = frozenset({"latest", "latest_checkpointed_iteration.txt"})
#: Files that make a folder a checkpoint of its own (a model's config and weights at its top), as
#: opposed to what tools leave beside checkpoint folders: DeepSpeed's ``zero_to_fp32.py`` and
#: ``zero_to_torch.py`` (copied into the save_dir under ZeRO), trackers, READMEs, logs, ``.nfs*`` files.
_OWN_CHECKPOINT_FILE = re.compile(
    r"config\.json|.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?|.*\.distcp"
    r"|.*model_states\.pt"
)
_HAS_DIGIT = re.compile(r"\d")
#: Files whose change after a checkpoint was judged ready means its weights changed.
_WEIGHT_FILE = re.compile(r".*\.(?:safetensors|bin|pt|pth|distcp)")
#: The most of a run root's ``trainer_state.json`` read to find the step of a model saved there.
_TRAINER_STATE_MAX = 16 * 1024 * 1024


def _subdirs(folder: Path, passed_over: list[Path] | None = None) -> list[Path]:
    """The folders in ``folder`` that could be checkpoints (``OSError`` if it cannot be listed); those
    whose name says they are being written or hidden but carries a step go to ``passed_over``."""
    try:
        entries = list(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for path in sorted(entries):
        if not layouts.is_ignored_name(path.name):
            if _is_dir(path):
                found.append(path)
        elif passed_over is not None and layouts.parse_step(path.name) != (None, None) and _is_dir(path):
            passed_over.append(path)
    return found


def _is_dir(path: Path) -> bool:
    """``Path.is_dir`` that says yes to a folder it cannot stat (EACCES, EIO) and has a step in its name,
    and to a symlink loop (``step_250 -> step_251 -> step_250``): that one is looked at, so that its error
    is recorded against it instead of failing the whole scan or being passed over without a word."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF):
            return False
        return exc.errno == errno.ELOOP or layouts.parse_step(path.name) != (None, None)


def is_container(folder: Path) -> bool:
    """A folder that holds checkpoint folders rather than being one (OpenRLHF's ``_actor``, any
    DeepSpeed ``save_dir`` below the run root).

    Its name is none a layout owns (no step word: ``checkpoint-N``, ``global_stepN``, ...), it holds a
    tracker such as ``latest`` or a sub-folder whose name carries a step, and no model of its own (see
    :data:`_OWN_CHECKPOINT_FILE`): DeepSpeed's recovery scripts, logs or a README beside the tags do not
    make it a checkpoint (they did: OpenRLHF's ``_actor`` under ZeRO was passed over without a word).
    Digits in its name (``ds2``, ``Qwen2.5-7B-Instruct``) do not make it one either: they name a model.
    """
    if layouts.parse_step(folder.name, bare_number=False) != (None, None):
        return False
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False  # unreadable: looked at as a folder of its own, which records why
    has_subdir = holds_steps = False
    for entry in entries:
        if _is_dir(entry):
            has_subdir = True
            named = not layouts.is_ignored_name(entry.name)
            # Any number in a sub-folder's name counts (``wandb/run-20261201_120000-ab12cd34``): what is in
            # a container is looked at, and named if it is no checkpoint, instead of the container alone.
            holds_steps = holds_steps or (named and _HAS_DIGIT.search(entry.name) is not None)
        elif entry.name in TRACKER_FILES:
            holds_steps = True
        elif _OWN_CHECKPOINT_FILE.fullmatch(entry.name):
            return False
    return has_subdir and holds_steps


def candidate_dirs(root: Path, passed_over: list[Path] | None = None) -> list[Path]:
    """The folders under a run root that could be checkpoints: its children, and a container's; folders
    named as being written (``tmp-checkpoint-5``) go to ``passed_over``, to be reported."""
    found: list[Path] = []
    for child in _subdirs(root, passed_over):
        if not is_container(child):
            found.append(child)
            continue
        try:
            found.extend(_subdirs(child, passed_over))
        except OSError:
            found.append(child)  # emptied or made unreadable since: its own look says which
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
        #: Folders found ready in this pass, settled at its end (:meth:`_settle_ready`), by path.
        self._ready: dict[str, tuple[_RunState, Path, str, str]] = {}
        self._settled_any = False
        for run in runs:
            with database.session() as session:
                states = queries.checkpoint_states(session, run.run_id)
                alternate_paths = queries.alternate_paths(session, run.run_id)
                ignored = queries.ignored_paths(session, run.run_id)
            state = _RunState(run, settled=alternate_paths, ignored=ignored)
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
            try:
                if self._discovered:
                    self._write_discovered()
                # After the discovered rows: a ready shape must see a preferred one still being written.
                self._settle_ready()
            finally:
                # Not settled (the database went away): still candidates, looked at again by a later pass.
                self._ready.clear()
            # Planned once per pass, in a transaction of its own: a crash in between leaves ready, unplanned
            # checkpoints, which the planner takes up at the next start. An invalid or vanished checkpoint
            # counts too: it may release newer ones held behind it.
            if self._settled_any and self._after_ready is not None:
                self.enqueued += self._after_ready()
                self._settled_any = False

    def _write_discovered(self) -> None:
        """Register the pass's newly discovered checkpoints, in one statement while they all go in.

        Kept until written: with the database away the batch waits for the next pass. A batch the
        database refuses is poisoned by one of its rows (nothing else differs between them): it is
        written row by row, and a row refused alone is that checkpoint's problem (:meth:`_unwritable`).
        """
        batch = [item for item in self._discovered if str(item[1]) not in item[0].settled]
        # (settled later in the same pass: its own write stands)
        rows = [self._new_row(state, path, layout, reason) for state, path, layout, reason in batch]
        try:
            with self._db.session() as session:
                queries.register_discovered(session, rows)
        except DatabaseUnreachable:
            raise
        except Exception:
            for index, (item, row) in enumerate(zip(batch, rows, strict=True)):
                state, path, layout, _ = item
                # What is not written yet stays for the next pass if the database goes away meanwhile.
                self._discovered = batch[index:]
                try:
                    with self._db.session() as session:
                        queries.register_discovered(session, [row])
                except DatabaseUnreachable:
                    raise
                except Exception as exc:
                    self._unwritable(state, path, layout, exc)
        self._discovered = []

    def _new_row(self, state: _RunState, path: Path, layout: str, reason: str) -> queries.NewCheckpoint:
        step, epoch, _ = self._step(path, layout)
        return queries.NewCheckpoint(
            state.run.run_id, str(path), _name(state, path), step, epoch, layout, reason
        )

    def _unwritable(self, state: _RunState, path: Path, layout: str | None, exc: Exception) -> None:
        """The database refused to store this checkpoint (not an outage: a value it cannot take): record
        it ``invalid`` with the database's reason, without the values that may be the cause; if even that
        is refused, drop it with one error line naming the folder. Either way it is not tried again."""
        problem = f"the database refused to record it: {error_reason(exc)}"
        try:
            with self._db.session() as session:
                queries.record_checkpoint(
                    session,
                    run_id=state.run.run_id,
                    path=str(path),
                    name=_name(state, path),
                    step=None,
                    epoch=None,
                    layout=layout or "unknown",
                    state=CheckpointState.INVALID,
                    reason=problem,
                )
        except DatabaseUnreachable:
            raise
        except Exception as again:
            log.error(
                "checkpoint.unrecordable",
                run=state.run.config.name,
                path=str(path),
                error=problem,
                then=error_reason(again),
                action="dropped: looked at again only after a restart",
            )
        else:
            log.warning("checkpoint.invalid", run=state.run.config.name, path=str(path), reason=problem)
        self._forget(state, path)
        self._settled_any = True

    @staticmethod
    def _forget(state: _RunState, path: Path) -> None:
        key = str(path)
        state.candidates.pop(key, None)
        state.recorded.discard(key)
        state.unreadable.pop(key, None)
        state.settled.add(key)

    def scan(self) -> None:
        """Look at every directory under every root (the safety net under events)."""
        with self._batched():
            self._scan()

    def _scan(self) -> None:
        for state in self._runs.values():
            root = state.run.config.root
            problem = _root_problem(root)
            if problem is not None:
                # A loop made while it runs (config check refuses one at start): this run waits, the
                # others go on.
                if not state.root_unreadable_logged:
                    log.error("run.root_unreadable", run=state.run.config.name, root=str(root), error=problem)
                    state.root_unreadable_logged = True
                continue
            if not os.path.isdir(root):  # noqa: PTH112 (never raises, unlike Path.is_dir on 3.11)
                if not state.root_missing_logged:
                    log.warning("run.root_missing", run=state.run.config.name, root=str(root))
                    state.root_missing_logged = True
                continue
            state.root_missing_logged = False
            passed_over: list[Path] = []
            try:
                found = candidate_dirs(root, passed_over)
            except OSError as exc:
                # The root itself (not one checkpoint) cannot be listed: this run waits, the others go on.
                if not state.root_unreadable_logged:
                    log.error(
                        "run.root_unreadable", run=state.run.config.name, root=str(root), error=str(exc)
                    )
                    state.root_unreadable_logged = True
                continue
            state.root_unreadable_logged = False
            for path in passed_over:
                self._ignore(state, path, refusals.IGNORED_NAME, level="info")
            for path in found:
                if str(path) not in state.settled:
                    self._look(state, path)
            # What was passed over and is gone (a tmp folder renamed into place) is forgotten.
            present_names = {_ignored_key(p) for p in (*found, *passed_over)}
            if self._root_model(state):
                present_names.add(str(root))
            self._overwritten(state)
            self._unignore(state, [k for k in state.ignored if k not in present_names])
            # Recorded ones deleted while nobody watched are marked vanished: left as discovered, they
            # would hold every newer checkpoint back from planning.
            present = {str(p) for p in found}
            for key in [*state.recorded, *state.candidates, *state.unreadable]:
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
        is_dir = os.path.isdir(path)  # noqa: PTH112 (never raises, unlike Path.is_dir on 3.11)
        if is_dir and is_container(path):
            try:
                inside = _subdirs(path)
            except OSError:
                inside = [path]  # unreadable since: its own look records why
            targets = inside + [Path(k) for k in state.candidates if Path(k).parent == path]
        elif not is_dir and str(path) not in state.candidates:
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
                if key in state.waiting:
                    continue  # looked at again when what it waits for settles, or by a rescan
                waited = now - candidate.stable_since
                if waited >= quiet or waited >= limit or state.run.config.marker is not None:
                    self._look(state, Path(key))

    def _look(self, state: _RunState, path: Path) -> None:
        try:
            self._look_into(state, path)
        except DatabaseUnreachable:
            raise
        except (FileNotFoundError, NotADirectoryError):
            if not os.path.isdir(path):  # noqa: PTH112 (never raises, unlike Path.is_dir on 3.11)
                self._gone(state, path)
            # else a file went while it was read: the next look sees the folder as it is then
        except OSError as exc:
            self._unreadable(state, path, exc)
        except MemoryError:
            raise
        except Exception as exc:
            self._broken(state, path, exc)

    def _broken(self, state: _RunState, path: Path, exc: Exception) -> None:
        """Judging this folder raised (a ``RecursionError`` from a deeply nested JSON file, a
        ``ValueError`` or ``UnicodeError`` from a file no layout expected): the folder's problem, recorded
        ``invalid`` with the error, never the pass's."""
        message = " ".join(str(exc).split())[:300]
        reason = f"cannot judge {refusals.shown(_name(state, path))}: {type(exc).__name__}: {message}"
        self._settle(state, path, None, CheckpointState.INVALID, reason, "invalid")

    def _look_into(self, state: _RunState, path: Path) -> None:
        """Look at one folder; ``OSError`` from reading it is :meth:`_look`'s to place."""
        key = str(path)
        run = state.run
        now = self._clock()
        problem = refusals.name_problem(path.name)
        if problem is not None:
            self._bad_name(state, path, problem)
            return
        if path.parent == run.config.root and is_container(path):
            self._not_a_checkpoint(state, path)
            return
        problem = _link_problem(state, path)
        if problem is not None:
            self._settle(state, path, None, CheckpointState.INVALID, problem, "refused")
            return
        snapshot = layouts.take_snapshot(path)
        state.unreadable.pop(key, None)
        candidate = state.candidates.get(key)
        if candidate is None or candidate.snapshot != snapshot:
            recorded = candidate.recorded if candidate else key in state.recorded
            seen_since = candidate.seen_since if candidate else now
            candidate = _Candidate(snapshot, now, recorded=recorded, seen_since=seen_since)
            state.candidates[key] = candidate
        layout = layouts.detect(path, snapshot, run.config.layout)
        if layout is not None:
            _, _, problem = self._step(path, layout, raising=True)
            if problem is not None:
                # The name is final: no quiet period makes the step fit.
                self._settle(state, path, layout, CheckpointState.INVALID, problem, "invalid")
                return
        if layout is None:
            # Nothing recognisable yet; it stays a candidate. One recorded earlier whose files went (an
            # emptied folder) must not stay "discovered", holding every newer checkpoint back.
            if candidate.recorded and now - candidate.stable_since >= self._scheduling.invalid_after_secs:
                reason = "no recognisable checkpoint in it any more"
                self._settle(state, path, None, CheckpointState.INVALID, reason, "invalid")
            elif not candidate.recorded and (unsupported := refusals.unsupported(snapshot.names())):
                # A trainer's own format (Megatron, NeMo-RL): said at once, with how to export weights.
                self._ignore(state, path, unsupported, level="warning")
            elif not candidate.recorded and now - candidate.seen_since >= self._scheduling.invalid_after_secs:
                # Still looked at (files may come), but said once: a folder nobody hears of is a silent skip.
                reason = refusals.unrecognised(now - candidate.seen_since, snapshot.names())
                self._ignore(state, path, reason, level="warning")
            return
        if _ignored_key(path) in state.ignored:
            self._unignore(state, [_ignored_key(path)])  # recognised after all
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

    def _ignore(
        self,
        state: _RunState,
        path: Path,
        reason: str,
        *,
        level: str,
        name: str | None = None,
        event: str = "folder.ignored",
        **context: object,
    ) -> None:
        """Note a folder that could be a checkpoint and is not taken, with why; logged once. Its path and
        name are stored escaped (:func:`refusals.shown`): one no database takes is still listed."""
        key = _ignored_key(path)
        if key in state.ignored:
            return
        error = None
        shown_name = refusals.shown(name if name is not None else _name(state, path))
        try:
            with self._db.session() as session:
                queries.record_ignored(
                    session, run_id=state.run.run_id, path=key, name=shown_name, reason=reason
                )
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            error = error_reason(exc)  # said in the line instead: the line is what must not be lost
        state.ignored[key] = reason
        fields = {**context, "error": error} if error is not None else context
        getattr(log, level)(event, run=state.run.config.name, path=str(path), reason=reason, **fields)

    def _bad_name(self, state: _RunState, path: Path, problem: str) -> None:
        """A name that must never take a step (a newline in it, bytes that are not UTF-8): noted under its
        escaped name, and settled ``invalid`` if an earlier daemon had recorded it as a checkpoint."""
        key = str(path)
        candidate = state.candidates.pop(key, None)
        state.unreadable.pop(key, None)
        if key in state.recorded or (candidate is not None and candidate.recorded):
            self._settle(state, path, None, CheckpointState.INVALID, problem, "invalid")
            return
        self._ignore(state, path, problem, level="warning")

    def _not_a_checkpoint(self, state: _RunState, path: Path) -> None:
        """A candidate that now holds checkpoints (an engine save_dir made before its first save) is one
        no more: what it holds is looked at instead, each folder with its own step. Read as one, it took
        the step and, later, the weights of whatever ``latest`` named when its job ran."""
        key = str(path)
        candidate = state.candidates.pop(key, None)
        state.unreadable.pop(key, None)
        state.waiting.pop(key, None)
        if key in state.recorded or (candidate is not None and candidate.recorded):
            self._settle(state, path, None, CheckpointState.INVALID, refusals.CONTAINER, "invalid")
        elif _ignored_key(path) in state.ignored:
            self._unignore(state, [_ignored_key(path)])
        try:
            inside = _subdirs(path)
        except OSError:
            return  # unreadable since: the next scan lists it again
        for folder in inside:
            if str(folder) not in state.settled:
                self._look(state, folder)

    def _root_model(self, state: _RunState) -> bool:
        """Whether the run root itself holds a model (``trainer.save_model(output_dir)``); said once, with
        how to have it evaluated."""
        root = state.run.config.root
        try:
            with os.scandir(root) as entries:
                # Names only (no stat): a link loop among them is the scan's to name, not this check's.
                names = sorted(entry.name for entry in entries)
            weights = [n for n in names if _OWN_CHECKPOINT_FILE.fullmatch(n) and n != "config.json"]
            if "config.json" not in names or not weights:
                return False
            if str(root) not in state.ignored:
                step = _trainer_state_step(root / "trainer_state.json")
                reason = refusals.root_model(["config.json", *weights[:3]], step)
                self._ignore(state, root, reason, level="warning", name="(run root)")
        except OSError:
            return False  # the root cannot be listed: the scan says so
        return True

    def _overwritten(self, state: _RunState) -> None:
        """Stat the weight files of the checkpoints this daemon judged ready: one whose weights changed
        since is said once (a warning line, and listed in ``evald status``); it is not evaluated again."""
        for key, evaluated in list(state.evaluated.items()):
            changed = None
            try:
                for before in evaluated.weights:
                    now = (Path(key) / before.relpath).stat()
                    if (now.st_size, now.st_mtime_ns) != (before.size, before.mtime_ns):
                        changed = f"{before.relpath}: {before.size} bytes then, {now.st_size} now, rewritten"
                        break
            except FileNotFoundError:
                del state.evaluated[key]  # rotated away: nothing to compare any more
                continue
            except OSError:
                continue  # unreadable for now: compared again by the next rescan
            if changed is None:
                continue
            del state.evaluated[key]
            reason = refusals.overwritten(evaluated.name, evaluated.step, changed)
            self._ignore(
                state,
                Path(key),
                reason,
                level="warning",
                event="checkpoint.overwritten",
                checkpoint=evaluated.name,
                step=evaluated.step,
            )

    def _unignore(self, state: _RunState, keys: list[str]) -> None:
        if not keys:
            return
        with self._db.session() as session:
            queries.forget_ignored(session, state.run.run_id, keys)
        for key in keys:
            state.ignored.pop(key, None)

    def _gone(self, state: _RunState, path: Path) -> None:
        key = str(path)
        candidate = state.candidates.pop(key, None)
        state.unreadable.pop(key, None)
        if (candidate is not None and candidate.recorded) or key in state.recorded:
            self._settle(
                state, path, None, CheckpointState.VANISHED, "deleted before it was complete", "vanished"
            )

    def _unreadable(self, state: _RunState, path: Path, exc: OSError) -> None:
        """An error reading this one folder: refused at once if it stays (a symlink loop, a permission),
        else looked at again by later passes and refused once it has lasted ``invalid_after_secs``."""
        key = str(path)
        problem = refusals.read_problem(exc, str(state.run.config.root))
        if not refusals.is_transient(exc.errno):
            self._settle(state, path, None, CheckpointState.INVALID, problem, "invalid")
            return
        now = self._clock()
        since = state.unreadable.get(key)
        if since is None:
            since = state.unreadable[key] = now
            log.warning(
                "checkpoint.unreadable",
                run=state.run.config.name,
                path=str(path),
                reason=problem,
                action="retry",
            )
        if now - since >= self._scheduling.invalid_after_secs:
            reason = f"unreadable for {now - since:.0f} s: {problem}"
            self._settle(state, path, None, CheckpointState.INVALID, reason, "invalid")

    def _act(
        self, state: _RunState, path: Path, layout: str, candidate: _Candidate, outcome: Outcome
    ) -> None:
        if outcome.decision is Decision.READY:
            # Settled at the end of the pass, once every folder of it has been looked at: two shapes of
            # a step both ready at their first look (a marker, a start-up scan) are then one checkpoint,
            # in the preferred shape, whatever order the scan met them in.
            self._ready[str(path)] = (state, path, layout, outcome.reason)
            candidate.last_reason = outcome.reason
        elif outcome.decision is Decision.INVALID:
            self._settle(state, path, layout, CheckpointState.INVALID, outcome.reason, "invalid")
        else:
            if not candidate.recorded:
                self._discovered.append((state, path, layout, outcome.reason))
                candidate.recorded = True
                log.info("checkpoint.discovered", run=state.run.config.name, path=str(path), layout=layout)
            candidate.last_reason = outcome.reason

    def _settle_ready(self) -> None:
        """Settle the pass's ready folders, each step's shapes in the run's preference order: the first
        is the checkpoint (unless a preferred shape is still being written), the others its alternates.
        What settling releases (a shape that waited) is looked at and settled in the same loop."""
        while self._ready:
            ordered = sorted(self._ready.values(), key=self._ready_order)
            self._ready.clear()
            for state, path, layout, reason in ordered:
                candidate = state.candidates.get(str(path))
                if str(path) in state.settled or candidate is None:
                    continue  # settled meanwhile (an alternate released by an earlier one)
                try:
                    if not self._another_shape(state, path, layout, candidate):
                        self._settle(state, path, layout, CheckpointState.READY, reason, "ready")
                except DatabaseUnreachable:
                    raise
                except MemoryError:
                    raise
                except Exception as exc:
                    self._broken(state, path, exc)

    def _ready_order(self, item: tuple[_RunState, Path, str, str]) -> tuple[str, int, int, str]:
        state, path, layout, _ = item
        step, _, _ = self._step(path, layout)
        rank = alternates.rank(_shape(layout, path), state.run.config.prefer)
        return (state.run.config.name, -1 if step is None else step, rank, str(path))

    def _another_shape(self, state: _RunState, path: Path, layout: str, candidate: _Candidate) -> bool:
        """Whether this ready folder is another shape of a step already taken (recorded as its alternate)
        or waits for the step's preferred shape; see :mod:`daemon.watching.alternates`."""
        key = str(path)
        step, _, _ = self._step(path, layout)
        if step is None:
            return False
        try:
            with self._db.session() as session:
                rows = queries.same_step(session, state.run.run_id, step, key)
        except DatabaseUnreachable:
            raise
        except Exception:
            return False  # a path the database cannot take: settling it says so (see _unwritable)
        if not rows:
            state.waiting.pop(key, None)
            return False
        others = [alternates.Other(r.id, r.name, r.state, _shape(r.layout, Path(r.path))) for r in rows]
        shape = _shape(layout, path)
        decision = alternates.choose(shape, others, state.run.config.prefer)
        if decision.choice is alternates.Choice.CHECKPOINT or decision.other is None:
            state.waiting.pop(key, None)
            return False
        other = decision.other
        if decision.choice is alternates.Choice.WAIT:
            awaited = next(r.path for r in rows if r.id == other.id)
            if state.waiting.get(key) != awaited:
                state.waiting[key] = awaited
                log.info(
                    "checkpoint.waiting", run=state.run.config.name, path=key, reason=decision.reason(shape)
                )
            candidate.last_reason = decision.reason(shape)
            return True
        try:
            with self._db.session() as session:
                queries.record_alternate(
                    session,
                    run_id=state.run.run_id,
                    checkpoint_id=other.id,
                    path=key,
                    name=_name(state, path),
                    layout=layout,
                )
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            self._unwritable(state, path, layout, exc)
            return True
        state.waiting.pop(key, None)
        self._forget(state, path)
        log.info(
            "checkpoint.alternate",
            run=state.run.config.name,
            path=key,
            of=other.name,
            reason=decision.reason(shape),
        )
        self._settled_any = True
        self._release_waiters(state, path)
        return True

    def _release_waiters(self, state: _RunState, path: Path) -> None:
        """What waited for ``path`` (now settled) is looked at again at once."""
        for waiter in [w for w, awaited in state.waiting.items() if awaited == str(path)]:
            del state.waiting[waiter]
            if waiter not in state.settled:
                self._look(state, Path(waiter))

    def _settle(
        self, state: _RunState, path: Path, layout: str | None, new: CheckpointState, reason: str, event: str
    ) -> None:
        step, epoch, _ = self._step(path, layout)
        candidate = state.candidates.get(str(path))
        # Written before it is forgotten: if the database is away, the candidate is still there to be
        # settled by a later pass.
        try:
            with self._db.session() as session:
                self._record_in(session, state, path, layout or "unknown", new, reason, step, epoch)
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            self._unwritable(state, path, layout, exc)
            return
        self._forget(state, path)
        if new is CheckpointState.READY and candidate is not None:
            weights = tuple(
                f for f in candidate.snapshot.files if _WEIGHT_FILE.fullmatch(Path(f.relpath).name)
            )
            state.evaluated[str(path)] = _Evaluated(_name(state, path), step, weights)
        log_method = log.info if new is CheckpointState.READY else log.warning
        log_method(f"checkpoint.{event}", run=state.run.config.name, path=str(path), step=step, reason=reason)
        self._settled_any = True
        self._release_waiters(state, path)

    @staticmethod
    def _step(
        path: Path, layout: str | None, *, raising: bool = False
    ) -> tuple[int | None, int | None, str | None]:
        """(step, epoch, problem): both ``None`` with the problem when the name's cannot be stored, or the
        layout could not read it; with ``raising``, an ``OSError`` reading it is the caller's to place."""
        try:
            if layout is not None and layout in layouts.REGISTRY:
                step, epoch = layouts.get(layout).step(path)
            else:
                step, epoch = layouts.parse_step(path.name)
        except OSError:
            if raising:
                raise
            return (
                None,
                None,
                f"cannot read the step of {refusals.shown(path.name)}: the folder is unreadable",
            )
        except MemoryError:
            raise
        except Exception as exc:
            message = " ".join(str(exc).split())[:300]
            return (
                None,
                None,
                f"cannot read the step of {refusals.shown(path.name)}: {type(exc).__name__}: {message}",
            )
        problem = layouts.step_problem(path.name, step, epoch)
        return (None, None, problem) if problem is not None else (step, epoch, None)

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


def _shape(layout: str, path: Path) -> layouts.Shape:
    return layouts.get(layout).shape(path) if layout in layouts.REGISTRY else layouts.Shape.RESUMABLE


def _link_problem(state: _RunState, path: Path) -> str | None:
    """Why ``path``, symlinks followed, is not a folder of its own strictly inside the run root."""
    return refusals.link_problem(
        _name(state, path), os.path.realpath(path), state.real_root, os.path.realpath(path.parent)
    )


def _ignored_key(path: Path) -> str:
    """How a noted folder is keyed, in memory and in the database: its path, escaped when no database
    could store it as it is (a newline, bytes that are not UTF-8)."""
    return refusals.shown(str(path))


def _root_problem(root: Path) -> str | None:
    """Why a run root cannot be watched although something is there (a symlink loop, a permission), or
    ``None``: one that does not exist yet is not a problem (the trainer creates it)."""
    try:
        root.stat()
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        if exc.errno == errno.ELOOP:
            return f"the run root {root} is a symlink loop ({exc.strerror}): not watched until it is fixed"
        return f"the run root {root} cannot be read ({exc.strerror}): not watched until it can"
    return None


def _trainer_state_step(path: Path) -> int | None:
    """``global_step`` of a ``trainer_state.json``; ``None`` when there is none, or it is not a small
    regular file (never opened then: a FIFO would block) or holds no usable step."""
    try:
        # Opened without blocking and judged by what was opened: a FIFO swapped in never holds the loop.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > _TRAINER_STATE_MAX:
                return None
            data = json.loads(handle.read(_TRAINER_STATE_MAX))
    except (OSError, ValueError, RecursionError):
        return None
    step = data.get("global_step") if isinstance(data, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
