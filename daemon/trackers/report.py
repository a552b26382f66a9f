"""Where results went: one line per configured tracker, for the demo and the operator."""

from __future__ import annotations

from sqlalchemy import func, select

from daemon.trackers.config import TrackerConfig
from storage.database import Database
from storage.models import OutboxMessage, OutboxState


def describe(tracker: TrackerConfig) -> str:
    """The tracker's destination in words (no connection made)."""
    if tracker.kind == "mlflow":
        run = "the trainer's run where found, else an own run" if tracker.attach == "trainer" else "own run"
        return f"MLflow {tracker.tracking_uri}, experiment {tracker.experiment!r} ({run})"
    if tracker.kind == "wandb":
        mode = "offline files, send with `wandb sync`" if tracker.mode == "offline" else "online"
        return f"W&B project {tracker.project} ({mode})"
    folder = tracker.dir if tracker.dir is not None else "<run root>/evald_tensorboard"
    return f"TensorBoard event files in {folder}/<run>"


def destinations(database: Database, trackers: tuple[TrackerConfig, ...]) -> list[str]:
    lines = []
    with database.session() as session:
        for tracker in trackers:
            counts = dict(
                session.execute(
                    select(OutboxMessage.state, func.count())
                    .where(OutboxMessage.endpoint == tracker.endpoint)
                    .group_by(OutboxMessage.state)
                ).all()
            )
            total = sum(int(n) for n in counts.values())
            sent = int(counts.get(OutboxState.DELIVERED, 0))
            rest = "" if sent == total else f" (the rest: at the next start, or evald export {tracker.kind})"
            lines.append(
                f"results also went to {tracker.name}: {describe(tracker)}: "
                f"{sent} of {total} evaluation(s) delivered{rest}"
            )
    return lines
