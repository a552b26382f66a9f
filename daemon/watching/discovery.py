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

Which folders to look at is :mod:`daemon.watching.folders`'; what is kept of each run between passes,
:mod:`daemon.watching.runs`; the database writes and the settling of a step's shapes,
:mod:`daemon.watching.ledger`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import structlog

from daemon.config import SchedulingConfig
from daemon.watching import refusals
from daemon.watching.folders import (
    OWN_CHECKPOINT_FILE,
    candidate_dirs,
    is_container,
    root_problem,
    step_of,
    stray_files,
    subdirs,
    trainer_state_step,
)
from daemon.watching.ledger import Ledger
from daemon.watching.object_runs import ObjectRuns, Paused
from daemon.watching.readiness import Decision, Outcome, decide
from daemon.watching.runs import Candidate, RunState, WatchedRun, fingerprint, ignored_key, link_problem
from inference import layouts
from inference.layouts import Readiness, Verdict
from inference.layouts.base import TreeRefused
from storage import queries
from storage.database import Database
from storage.errors import DatabaseUnreachable
from storage.models import CheckpointState

log = structlog.get_logger("evald.discovery")


class Discovery:
    def __init__(
        self,
        database: Database,
        runs: Iterable[WatchedRun],
        scheduling: SchedulingConfig,
        clock: Callable[[], float] = time.monotonic,
        after_ready: Callable[[], int] | None = None,
        paused: Paused | None = None,
    ) -> None:
        """``paused``: the s3 runs paused under the Discovery a reload replaces (its :meth:`paused`)."""
        #: Plans what became ready (the frequency policy) and returns how many jobs that created.
        self._after_ready = after_ready
        self._scheduling = scheduling
        self._clock = clock
        self._runs: dict[str, RunState] = {}
        #: Jobs created since the caller last reset it: the queue only needs a look when this moved.
        self.enqueued = 0
        self._ledger = Ledger(database, look=self._look)
        runs = list(runs)
        #: Runs whose root is ``s3://``: listed into their local mirror before each scan of it.
        self._objects = ObjectRuns(runs, paused=paused)
        for run in runs:
            with database.session() as session:
                states = queries.checkpoint_states(session, run.run_id)
                alternate_paths = queries.alternate_paths(session, run.run_id)
                ignored = queries.ignored_paths(session, run.run_id)
            state = RunState(run, settled=alternate_paths, ignored=ignored)
            for path, checkpoint_state in states.items():
                if checkpoint_state is CheckpointState.DISCOVERED:
                    state.recorded.add(path)
                else:
                    state.settled.add(path)
                if checkpoint_state is CheckpointState.INVALID:
                    state.invalid[path] = None  # its listing taken at the first rescan
            self._runs[run.config.name] = state

    def paused(self) -> Paused:
        """Why each paused s3 run's store could not be used, by (run name, URL): for a reload's Discovery."""
        return self._objects.paused()

    @contextmanager
    def _batched(self) -> Iterator[None]:
        """Newly discovered checkpoints are written in one transaction per pass, not one each: a restart
        over thousands of folders registers them in one commit."""
        try:
            yield
        finally:
            self._ledger.end_pass()
            # Planned once per pass, in a transaction of its own: a crash in between leaves ready, unplanned
            # checkpoints, which the planner takes up at the next start. An invalid or vanished checkpoint
            # counts too: it may release newer ones held behind it.
            if self._ledger.settled_any and self._after_ready is not None:
                self.enqueued += self._after_ready()
                self._ledger.settled_any = False

    def scan(self) -> None:
        """Look at every directory under every root (the safety net under events)."""
        with self._batched():
            self._scan()

    def _scan(self) -> None:
        for name, state in self._runs.items():
            if name in self._objects and not self._objects.sync(name):
                continue  # the store away or refusing: judged again after a pass that completes
            root = state.run.config.root
            problem = root_problem(root)
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
                self._ledger.ignore(state, path, refusals.IGNORED_NAME, level="info")
            strays = stray_files(root)
            for path, step in strays:
                self._ledger.ignore(state, path, refusals.stray_file(path.name, step), level="warning")
            for path in found:
                if str(path) not in state.settled:
                    self._look(state, path)
                elif str(path) in state.invalid:
                    self._reopen_if_changed(state, path)
            # What was passed over and is gone (a tmp folder renamed into place) is forgotten.
            present_names = {ignored_key(p) for p in (*found, *passed_over, *(p for p, _ in strays))}
            if self._root_model(state):
                present_names.add(str(root))
            self._overwritten(state)
            self._ledger.unignore(state, [k for k in state.ignored if k not in present_names])
            # Recorded ones deleted while nobody watched are marked vanished: left as discovered, they
            # would hold every newer checkpoint back from planning.
            present = {str(p) for p in found}
            for key in [k for k in state.invalid if k not in present]:
                del state.invalid[key]  # gone: nothing left to judge again
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
                inside = subdirs(path)
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
            elif str(target) in state.invalid:
                self._reopen_if_changed(state, target)

    def tick(self) -> None:
        """Re-look at candidates whose quiet period or incomplete limit may have run out."""
        with self._batched():
            self._tick()

    def _tick(self) -> None:
        now = self._clock()
        quiet = self._scheduling.quiet_secs
        limit = self._scheduling.invalid_after_secs
        for name, state in self._runs.items():
            if not self._objects.judged(name):
                continue  # its mirror is not in step with the store: judged after the next complete pass
            for key, candidate in list(state.candidates.items()):
                if key in state.waiting:
                    continue  # looked at again when what it waits for settles, or by a rescan
                waited = now - candidate.stable_since
                if waited >= quiet or waited >= limit or state.run.config.marker is not None:
                    self._look(state, Path(key))

    def _look(self, state: RunState, path: Path) -> None:
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
        except TreeRefused as exc:
            # Past the listing's bounds (thousands of files, folders nested deep): final, said at once.
            self._ledger.settle(state, path, None, CheckpointState.INVALID, exc.problem, "checkpoint.invalid")
        except MemoryError:
            raise
        except Exception as exc:
            self._ledger.broken(state, path, exc)

    def _look_into(self, state: RunState, path: Path) -> None:
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
        problem = link_problem(state, path)
        if problem is not None:
            self._ledger.settle(state, path, None, CheckpointState.INVALID, problem, "checkpoint.refused")
            return
        snapshot = layouts.take_snapshot(path)
        state.unreadable.pop(key, None)
        candidate = state.candidates.get(key)
        if candidate is None or candidate.snapshot != snapshot:
            recorded = candidate.recorded if candidate else key in state.recorded
            seen_since = candidate.seen_since if candidate else now
            candidate = Candidate(snapshot, now, recorded=recorded, seen_since=seen_since)
            state.candidates[key] = candidate
        layout = layouts.detect(path, snapshot, run.config.layout)
        if layout is not None:
            _, _, problem = step_of(path, layout, raising=True)
            if problem is not None:
                # The name is final: no quiet period makes the step fit.
                self._ledger.settle(
                    state, path, layout, CheckpointState.INVALID, problem, "checkpoint.invalid"
                )
                return
        if layout is None:
            self._unrecognised(state, path, candidate, now)
            return
        if ignored_key(path) in state.ignored:
            self._ledger.unignore(state, [ignored_key(path)])  # recognised after all
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
        if outcome.decision is Decision.INVALID and not verdict.final:
            # Named from evidence a write could still change (a file short of its header once the folder
            # was quiet): judged again if its files change. A final verdict (a name, a FIFO) is not.
            state.invalid[str(path)] = fingerprint(candidate.snapshot)

    def _unrecognised(self, state: RunState, path: Path, candidate: Candidate, now: float) -> None:
        """Nothing recognisable in it yet: it stays a candidate, said once when it has lasted."""
        names = candidate.snapshot.names()
        limit = self._scheduling.invalid_after_secs
        if candidate.recorded and now - candidate.stable_since >= limit:
            # One recorded earlier whose files went (an emptied folder) must not stay "discovered",
            # holding every newer checkpoint back.
            reason = "no recognisable checkpoint in it any more"
            self._ledger.settle(state, path, None, CheckpointState.INVALID, reason, "checkpoint.invalid")
        elif not candidate.recorded and (unsupported := refusals.unsupported(names)):
            # A trainer's own format (Megatron, NeMo-RL): said at once, with how to export weights.
            self._ledger.ignore(state, path, unsupported, level="warning")
        elif not candidate.recorded and now - candidate.seen_since >= limit:
            # Still looked at (files may come), but said once: a folder nobody hears of is a silent skip.
            reason = refusals.unrecognised(now - candidate.seen_since, names)
            self._ledger.ignore(state, path, reason, level="warning")

    def _act(self, state: RunState, path: Path, layout: str, candidate: Candidate, outcome: Outcome) -> None:
        if outcome.decision is Decision.READY:
            # Settled at the end of the pass, once every folder of it has been looked at: two shapes of
            # a step both ready at their first look (a marker, a start-up scan) are then one checkpoint,
            # in the preferred shape, whatever order the scan met them in.
            self._ledger.ready[str(path)] = (state, path, layout, outcome.reason)
            candidate.last_reason = outcome.reason
        elif outcome.decision is Decision.INVALID:
            self._ledger.settle(
                state, path, layout, CheckpointState.INVALID, outcome.reason, "checkpoint.invalid"
            )
        else:
            if not candidate.recorded:
                self._ledger.discovered.append((state, path, layout, outcome.reason))
                candidate.recorded = True
                log.info("checkpoint.discovered", run=state.run.config.name, path=str(path), layout=layout)
            candidate.last_reason = outcome.reason

    def _reopen_if_changed(self, state: RunState, path: Path) -> None:
        """An invalid checkpoint whose files changed since it was named is judged again: a weights file
        short of its header is named once the folder is quiet, and a write that stalled that long and then
        went on must not leave a good checkpoint invalid for good."""
        key = str(path)
        try:
            now = fingerprint(layouts.take_snapshot(path))
        except (OSError, TreeRefused):
            return  # gone, unreadable or past the bounds: as it was named
        was = state.invalid[key]
        if was is None or was == now:
            state.invalid[key] = now
            return
        del state.invalid[key]
        state.settled.discard(key)
        state.recorded.add(key)
        log.info(
            "checkpoint.reopened",
            run=state.run.config.name,
            path=key,
            reason="its files changed since it was named invalid",
        )
        self._look(state, path)

    def _gone(self, state: RunState, path: Path) -> None:
        key = str(path)
        candidate = state.candidates.pop(key, None)
        state.unreadable.pop(key, None)
        if (candidate is not None and candidate.recorded) or key in state.recorded:
            self._ledger.settle(
                state,
                path,
                None,
                CheckpointState.VANISHED,
                "deleted before it was complete",
                "checkpoint.vanished",
            )

    def _unreadable(self, state: RunState, path: Path, exc: OSError) -> None:
        """An error reading this one folder: refused at once if it stays (a symlink loop, a permission),
        else looked at again by later passes and refused once it has lasted ``invalid_after_secs``."""
        key = str(path)
        problem = refusals.read_problem(exc, str(state.run.config.root))
        if not refusals.is_transient(exc.errno):
            self._ledger.settle(state, path, None, CheckpointState.INVALID, problem, "checkpoint.invalid")
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
            self._ledger.settle(state, path, None, CheckpointState.INVALID, reason, "checkpoint.invalid")

    def _bad_name(self, state: RunState, path: Path, problem: str) -> None:
        """A name that must never take a step (a newline in it, bytes that are not UTF-8): noted under its
        escaped name, and settled ``invalid`` if an earlier daemon had recorded it as a checkpoint."""
        key = str(path)
        candidate = state.candidates.pop(key, None)
        state.unreadable.pop(key, None)
        if key in state.recorded or (candidate is not None and candidate.recorded):
            self._ledger.settle(state, path, None, CheckpointState.INVALID, problem, "checkpoint.invalid")
            return
        self._ledger.ignore(state, path, problem, level="warning")

    def _not_a_checkpoint(self, state: RunState, path: Path) -> None:
        """A candidate that now holds checkpoints (an engine save_dir made before its first save) is one
        no more: what it holds is looked at instead, each folder with its own step. Read as one, it took
        the step and, later, the weights of whatever ``latest`` named when its job ran."""
        key = str(path)
        candidate = state.candidates.pop(key, None)
        state.unreadable.pop(key, None)
        state.waiting.pop(key, None)
        if key in state.recorded or (candidate is not None and candidate.recorded):
            self._ledger.settle(
                state, path, None, CheckpointState.INVALID, refusals.CONTAINER, "checkpoint.invalid"
            )
        elif ignored_key(path) in state.ignored:
            self._ledger.unignore(state, [ignored_key(path)])
        try:
            inside = subdirs(path)
        except OSError:
            return  # unreadable since: the next scan lists it again
        for folder in inside:
            if str(folder) not in state.settled:
                self._look(state, folder)

    def _root_model(self, state: RunState) -> bool:
        """Whether the run root itself holds a model (``trainer.save_model(output_dir)``); said once, with
        how to have it evaluated."""
        root = state.run.config.root
        try:
            with os.scandir(root) as entries:
                # Names only (no stat): a link loop among them is the scan's to name, not this check's.
                names = sorted(entry.name for entry in entries)
            weights = [n for n in names if OWN_CHECKPOINT_FILE.fullmatch(n) and n != "config.json"]
            if "config.json" not in names or not weights:
                return False
            if str(root) not in state.ignored:
                step = trainer_state_step(root / "trainer_state.json")
                reason = refusals.root_model(["config.json", *weights[:3]], step)
                self._ledger.ignore(state, root, reason, level="warning", shown_as="(run root)")
        except OSError:
            return False  # the root cannot be listed: the scan says so
        return True

    def _overwritten(self, state: RunState) -> None:
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
            self._ledger.ignore(
                state,
                Path(key),
                reason,
                level="warning",
                event="checkpoint.overwritten",
                checkpoint=evaluated.name,
                step=evaluated.step,
            )
