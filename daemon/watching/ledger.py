"""Writes what discovery decides about folders: new candidates, settled fates, alternates and notes.

A pass's newly discovered folders go in one batch; its ready folders are settled at its end, each step's
shapes in the run's preference order (:mod:`daemon.watching.alternates`). A value the database refuses is
that folder's problem (recorded ``invalid``, or dropped with one error line); only the database being away
(:class:`DatabaseUnreachable`) is raised, and what it held is written by a later pass.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
from sqlalchemy.orm import Session

from daemon.watching import alternates, refusals
from daemon.watching.folders import WEIGHT_FILE, shape, step_of
from daemon.watching.runs import Candidate, Evaluated, RunState, ignored_key, name
from storage import queries
from storage.database import Database
from storage.database import reason as error_reason
from storage.errors import DatabaseUnreachable
from storage.models import CheckpointState

log = structlog.get_logger("evald.discovery")

#: A folder found in a pass: its run, path, layout and the reason given for it.
Found = tuple[RunState, Path, str, str]


class Ledger:
    def __init__(self, database: Database, look: Callable[[RunState, Path], None]) -> None:
        self._db = database
        #: Looks at a folder again: what waited for one just settled.
        self._look = look
        #: Newly discovered folders, written together at the end of the pass.
        self.discovered: list[Found] = []
        #: Folders found ready in this pass, settled at its end (:meth:`settle_ready`), by path.
        self.ready: dict[str, Found] = {}
        #: Whether a checkpoint was settled since the last plan: the planner then has work.
        self.settled_any = False

    def end_pass(self) -> None:
        """Write the pass's discovered folders, then settle its ready ones."""
        try:
            if self.discovered:
                self._write_discovered()
            # After the discovered rows: a ready shape must see a preferred one still being written.
            self._settle_ready()
        finally:
            # Not settled (the database went away): still candidates, looked at again by a later pass.
            self.ready.clear()

    def _write_discovered(self) -> None:
        """Register the pass's newly discovered checkpoints, in one statement while they all go in.

        Kept until written: with the database away the batch waits for the next pass. A batch the
        database refuses is poisoned by one of its rows (nothing else differs between them): it is
        written row by row, and a row refused alone is that checkpoint's problem (:meth:`unwritable`).
        """
        batch = [item for item in self.discovered if str(item[1]) not in item[0].settled]
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
                self.discovered = batch[index:]
                try:
                    with self._db.session() as session:
                        queries.register_discovered(session, [row])
                except DatabaseUnreachable:
                    raise
                except Exception as exc:
                    self.unwritable(state, path, layout, exc)
        self.discovered = []

    @staticmethod
    def _new_row(state: RunState, path: Path, layout: str, reason: str) -> queries.NewCheckpoint:
        step, epoch, _ = step_of(path, layout)
        return queries.NewCheckpoint(
            state.run.run_id, str(path), name(state, path), step, epoch, layout, reason
        )

    def unwritable(self, state: RunState, path: Path, layout: str | None, exc: Exception) -> None:
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
                    name=name(state, path),
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
        state.forget(path)
        self.settled_any = True

    def ignore(
        self,
        state: RunState,
        path: Path,
        reason: str,
        *,
        level: str,
        shown_as: str | None = None,
        event: str = "folder.ignored",
        **context: object,
    ) -> None:
        """Note a folder that could be a checkpoint and is not taken, with why; logged once. Its path and
        name are stored escaped (:func:`refusals.shown`): one no database takes is still listed."""
        key = ignored_key(path)
        if key in state.ignored:
            return
        error = None
        shown_name = refusals.shown(shown_as if shown_as is not None else name(state, path))
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

    def unignore(self, state: RunState, keys: list[str]) -> None:
        if not keys:
            return
        with self._db.session() as session:
            queries.forget_ignored(session, state.run.run_id, keys)
        for key in keys:
            state.ignored.pop(key, None)

    def broken(self, state: RunState, path: Path, exc: Exception) -> None:
        """Judging this folder raised (a ``RecursionError`` from a deeply nested JSON file, a
        ``ValueError`` or ``UnicodeError`` from a file no layout expected): the folder's problem, recorded
        ``invalid`` with the error, never the pass's."""
        message = " ".join(str(exc).split())[:300]
        reason = f"cannot judge {refusals.shown(name(state, path))}: {type(exc).__name__}: {message}"
        self.settle(state, path, None, CheckpointState.INVALID, reason, "checkpoint.invalid")

    def _settle_ready(self) -> None:
        """Settle the pass's ready folders, each step's shapes in the run's preference order: the first
        is the checkpoint (unless a preferred shape is still being written), the others its alternates.
        What settling releases (a shape that waited) is looked at and settled in the same loop."""
        while self.ready:
            ordered = sorted(self.ready.values(), key=_ready_order)
            self.ready.clear()
            for state, path, layout, reason in ordered:
                candidate = state.candidates.get(str(path))
                if str(path) in state.settled or candidate is None:
                    continue  # settled meanwhile (an alternate released by an earlier one)
                try:
                    if not self._another_shape(state, path, layout, candidate):
                        self.settle(state, path, layout, CheckpointState.READY, reason, "checkpoint.ready")
                except DatabaseUnreachable:
                    raise
                except MemoryError:
                    raise
                except Exception as exc:
                    self.broken(state, path, exc)

    def _another_shape(self, state: RunState, path: Path, layout: str, candidate: Candidate) -> bool:
        """Whether this ready folder is another shape of a step already taken (recorded as its alternate)
        or waits for the step's preferred shape; see :mod:`daemon.watching.alternates`."""
        key = str(path)
        step, _, _ = step_of(path, layout)
        if step is None:
            return False
        try:
            with self._db.session() as session:
                rows = queries.same_step(session, state.run.run_id, step, key)
        except DatabaseUnreachable:
            raise
        except Exception:
            return False  # a path the database cannot take: settling it says so (see unwritable)
        if not rows:
            state.waiting.pop(key, None)
            return False
        others = [alternates.Other(r.id, r.name, r.state, shape(r.layout, Path(r.path))) for r in rows]
        mine = shape(layout, path)
        decision = alternates.choose(mine, others, state.run.config.prefer)
        if decision.choice is alternates.Choice.CHECKPOINT or decision.other is None:
            state.waiting.pop(key, None)
            return False
        other = decision.other
        if decision.choice is alternates.Choice.WAIT:
            awaited = next(r.path for r in rows if r.id == other.id)
            if state.waiting.get(key) != awaited:
                state.waiting[key] = awaited
                log.info(
                    "checkpoint.waiting", run=state.run.config.name, path=key, reason=decision.reason(mine)
                )
            candidate.last_reason = decision.reason(mine)
            return True
        try:
            with self._db.session() as session:
                queries.record_alternate(
                    session,
                    run_id=state.run.run_id,
                    checkpoint_id=other.id,
                    path=key,
                    name=name(state, path),
                    layout=layout,
                )
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            self.unwritable(state, path, layout, exc)
            return True
        state.waiting.pop(key, None)
        state.forget(path)
        log.info(
            "checkpoint.alternate",
            run=state.run.config.name,
            path=key,
            of=other.name,
            reason=decision.reason(mine, name(state, path)),
        )
        self.settled_any = True
        self._release_waiters(state, path)
        return True

    def _release_waiters(self, state: RunState, path: Path) -> None:
        """What waited for ``path`` (now settled) is looked at again at once."""
        for waiter in [w for w, awaited in state.waiting.items() if awaited == str(path)]:
            del state.waiting[waiter]
            if waiter not in state.settled:
                self._look(state, Path(waiter))

    def settle(
        self, state: RunState, path: Path, layout: str | None, new: CheckpointState, reason: str, event: str
    ) -> None:
        step, epoch, _ = step_of(path, layout)
        candidate = state.candidates.get(str(path))
        # Written before it is forgotten: if the database is away, the candidate is still there to be
        # settled by a later pass.
        try:
            with self._db.session() as session:
                _record_in(session, state, path, layout or "unknown", new, reason, step, epoch)
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            self.unwritable(state, path, layout, exc)
            return
        state.forget(path)
        if new is CheckpointState.READY and candidate is not None:
            weights = tuple(
                f for f in candidate.snapshot.files if WEIGHT_FILE.fullmatch(Path(f.relpath).name)
            )
            state.evaluated[str(path)] = Evaluated(name(state, path), step, weights)
        log_method = log.info if new is CheckpointState.READY else log.warning
        log_method(event, run=state.run.config.name, path=str(path), step=step, reason=reason)
        self.settled_any = True
        self._release_waiters(state, path)


def _ready_order(item: Found) -> tuple[str, int, int, str]:
    state, path, layout, _ = item
    step, _, _ = step_of(path, layout)
    rank = alternates.rank(shape(layout, path), state.run.config.prefer)
    return (state.run.config.name, -1 if step is None else step, rank, str(path))


def _record_in(
    session: Session,
    state: RunState,
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
        name=name(state, path),
        step=step,
        epoch=epoch,
        layout=layout,
        state=new,
        reason=reason,
    )
