"""What an export needs beyond result rows: the evaluated checkpoint's path and how long its jobs took."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import Checkpoint, EvalJob, JobState, Run


@dataclass(frozen=True)
class EvaluatedCheckpoint:
    name: str
    path: str
    #: The succeeded jobs' durations (claim to result) summed; None when none is stored.
    duration_s: float | None


def evaluated_checkpoints(
    session: Session, *, run: str, step: int, tasks: Collection[str]
) -> list[EvaluatedCheckpoint]:
    """The checkpoints of ``run`` at ``step`` with a succeeded job of one of ``tasks`` (one, but for two
    folders saved at one step), by name."""
    query = (
        select(Checkpoint.name, Checkpoint.path, EvalJob.duration_s)
        .join(EvalJob, EvalJob.checkpoint_id == Checkpoint.id)
        .join(Run, Checkpoint.run_id == Run.id)
        .where(
            Run.name == run,
            Checkpoint.step == step,
            EvalJob.state == JobState.SUCCEEDED,
            EvalJob.task.in_(list(tasks)),
        )
        .order_by(Checkpoint.name, EvalJob.id)
    )
    found: dict[str, tuple[str, list[float]]] = {}
    for name, path, duration in session.execute(query):
        entry = found.setdefault(name, (path, []))
        if duration is not None:
            entry[1].append(float(duration))
    return [
        EvaluatedCheckpoint(name, path, sum(durations) if durations else None)
        for name, (path, durations) in found.items()
    ]
