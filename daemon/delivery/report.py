"""Where results went: one line per configured tracker, for the demo and the operator."""

from __future__ import annotations

from sqlalchemy import func, or_, select

from daemon.config import TrackerConfig
from daemon.delivery.messages import ALERT_PREFIX
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
            counts: dict[tuple[bool, OutboxState], int] = {}
            for is_alert, state, n in session.execute(
                select(OutboxMessage.event_id.startswith(ALERT_PREFIX), OutboxMessage.state, func.count())
                .where(
                    OutboxMessage.endpoint == tracker.endpoint,
                    # Where it points now (a row from before targets were kept is its too).
                    or_(OutboxMessage.target == tracker.target, OutboxMessage.target.is_(None)),
                )
                .group_by(OutboxMessage.event_id.startswith(ALERT_PREFIX), OutboxMessage.state)
            ).all():
                counts[(bool(is_alert), state)] = int(n)
            parts = []
            for is_alert, noun in ((False, "evaluation(s)"), (True, "alert event(s)")):
                total = sum(n for (a, _), n in counts.items() if a is is_alert)
                sent = counts.get((is_alert, OutboxState.DELIVERED), 0)
                if total or not is_alert:
                    parts.append(f"{sent} of {total} {noun} delivered")
            total = sum(counts.values())
            sent = sum(n for (_, state), n in counts.items() if state is OutboxState.DELIVERED)
            rest = "" if sent == total else f" (the rest: at the next start, or evald export {tracker.kind})"
            lines.append(
                f"results also went to {tracker.name}: {describe(tracker)}: {', '.join(parts)}{rest}"
            )
    return lines
