"""What discovery records besides checkpoints: other shapes of a checkpoint's step (alternates), and
folders it does not take (ignored), so that nothing under a run root is skipped without a word."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from storage.database import insert_for
from storage.models import Checkpoint, CheckpointAlternate, CheckpointState, IgnoredFolder, Run, utcnow


@dataclass(frozen=True)
class SameStep:
    """A live (discovered or ready) checkpoint of a run at a given step."""

    id: int
    path: str
    name: str
    layout: str
    state: CheckpointState


def same_step(session: Session, run_id: int, step: int, path: str) -> list[SameStep]:
    """The run's other discovered or ready checkpoints at ``step`` (not ``path`` itself), oldest first."""
    rows = session.execute(
        select(Checkpoint.id, Checkpoint.path, Checkpoint.name, Checkpoint.layout, Checkpoint.state)
        .where(
            Checkpoint.run_id == run_id,
            Checkpoint.step == step,
            Checkpoint.path != path,
            Checkpoint.state.in_((CheckpointState.DISCOVERED, CheckpointState.READY)),
        )
        .order_by(Checkpoint.id)
    )
    return [SameStep(*row) for row in rows]


def record_alternate(
    session: Session, *, run_id: int, checkpoint_id: int, path: str, name: str, layout: str
) -> None:
    """Record ``path`` as another shape of checkpoint ``checkpoint_id``; the row it had as a discovered
    checkpoint while it was written (no job ever points at one) goes, so it holds nothing back."""
    insert = insert_for(session)
    session.execute(
        insert(CheckpointAlternate)
        .values(run_id=run_id, checkpoint_id=checkpoint_id, path=path, name=name, layout=layout)
        .on_conflict_do_nothing(index_elements=["run_id", "path"])
    )
    session.execute(
        delete(Checkpoint).where(
            Checkpoint.run_id == run_id,
            Checkpoint.path == path,
            Checkpoint.state == CheckpointState.DISCOVERED,
        )
    )


def alternate_paths(session: Session, run_id: int) -> set[str]:
    return set(session.scalars(select(CheckpointAlternate.path).where(CheckpointAlternate.run_id == run_id)))


def record_ignored(session: Session, *, run_id: int, path: str, name: str, reason: str) -> None:
    insert = insert_for(session)
    statement = insert(IgnoredFolder).values(run_id=run_id, path=path, name=name, reason=reason)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["run_id", "path"], set_={"reason": reason, "seen_at": utcnow()}
        )
    )


def forget_ignored(session: Session, run_id: int, paths: Iterable[str]) -> None:
    chosen = list(paths)
    if chosen:
        session.execute(
            delete(IgnoredFolder).where(IgnoredFolder.run_id == run_id, IgnoredFolder.path.in_(chosen))
        )


def ignored_paths(session: Session, run_id: int) -> dict[str, str]:
    rows = session.execute(
        select(IgnoredFolder.path, IgnoredFolder.reason).where(IgnoredFolder.run_id == run_id)
    )
    return {path: reason for path, reason in rows}


@dataclass(frozen=True)
class IgnoredRow:
    run: str
    name: str
    reason: str
    seen_at: datetime


def ignored_rows(session: Session) -> list[IgnoredRow]:
    """Every run's ignored folders, by run and name (``evald status``)."""
    rows = session.execute(
        select(Run.name, IgnoredFolder.name, IgnoredFolder.reason, IgnoredFolder.seen_at)
        .join(Run, Run.id == IgnoredFolder.run_id)
        .order_by(Run.name, IgnoredFolder.name)
    )
    return [IgnoredRow(*row) for row in rows]


@dataclass(frozen=True)
class AlternateRow:
    run: str
    name: str
    layout: str
    #: The name of the checkpoint evaluated for this step.
    of: str


def alternate_rows(session: Session) -> list[AlternateRow]:
    rows = session.execute(
        select(Run.name, CheckpointAlternate.name, CheckpointAlternate.layout, Checkpoint.name)
        .join(Checkpoint, Checkpoint.id == CheckpointAlternate.checkpoint_id)
        .join(Run, Run.id == CheckpointAlternate.run_id)
        .order_by(Run.name, CheckpointAlternate.name)
    )
    return [AlternateRow(*row) for row in rows]
