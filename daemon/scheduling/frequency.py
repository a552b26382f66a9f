"""Whether a checkpoint is due: AReaL's step/epoch/time triggers, with its two flaws fixed.

Pure functions over an :class:`Anchor`, the point the last evaluation reset. Any trigger makes a
checkpoint due, and any evaluation resets all three (AReaL resets only the one that fired, so a time
trigger could fire right after a step-triggered evaluation). The anchor lives in the database, so a
restart neither repeats nor skips a checkpoint.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from daemon.config.scheduling import Frequency as Frequency


class Verdict(enum.StrEnum):
    DUE = "due"
    SKIPPED = "skipped"
    #: Not due by step or epoch, but the time trigger may still pick it if it is the newest then.
    WAITING = "waiting"


@dataclass(frozen=True)
class Anchor:
    """Where the last evaluation left the counters: its step, epoch and (wall-clock) time."""

    step: int
    epoch: int
    at: datetime


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str


def epoch_of(step: int | None, epoch: int | None, steps_per_epoch: int | None) -> int | None:
    """A checkpoint's epoch: its own, else derived from its step when the run says how long an epoch is."""
    if epoch is not None:
        return epoch
    if step is not None and steps_per_epoch is not None:
        return step // steps_per_epoch
    return None


def decide(
    frequency: Frequency, anchor: Anchor, *, step: int | None, epoch: int | None, now: datetime
) -> Decision:
    """Whether a newly ready checkpoint is due, skipped, or waits for the time trigger."""
    if frequency.every_checkpoint:
        return Decision(Verdict.DUE, "every checkpoint is due (no frequency set)")
    if step is None:
        # Folders such as ``final`` carry no step to count from; they are rare and deliberate.
        return Decision(Verdict.DUE, "no step number, so no frequency applies")
    if step <= anchor.step:
        return Decision(Verdict.SKIPPED, f"not due: step {step} is not after step {anchor.step}, evaluated")
    since = step - anchor.step
    elapsed = (now - anchor.at).total_seconds()
    if frequency.steps is not None and since >= frequency.steps:
        return Decision(Verdict.DUE, f"{since} steps since step {anchor.step}, freq_steps={frequency.steps}")
    if frequency.epochs is not None and epoch is not None and epoch - anchor.epoch >= frequency.epochs:
        return Decision(
            Verdict.DUE,
            f"epoch {epoch} is {epoch - anchor.epoch} after epoch {anchor.epoch}, "
            f"freq_epochs={frequency.epochs}",
        )
    if frequency.secs is not None and elapsed >= frequency.secs:
        return Decision(
            Verdict.DUE, f"{elapsed:.0f} s since the last evaluation, freq_secs={frequency.secs:g}"
        )
    parts = []
    if frequency.steps is not None:
        parts.append(f"{since} steps since step {anchor.step}, freq_steps={frequency.steps}")
    if frequency.epochs is not None:
        parts.append(
            f"epoch unknown (set steps_per_epoch), freq_epochs={frequency.epochs}"
            if epoch is None
            else f"epoch {epoch} is {epoch - anchor.epoch} after epoch {anchor.epoch}, "
            f"freq_epochs={frequency.epochs}"
        )
    if frequency.secs is not None:
        parts.append(f"{elapsed:.0f} s since the last evaluation, freq_secs={frequency.secs:g}")
        return Decision(Verdict.WAITING, "waiting for the time trigger: " + "; ".join(parts))
    return Decision(Verdict.SKIPPED, "not due: " + "; ".join(parts))


def time_due(frequency: Frequency, anchor: Anchor, now: datetime) -> bool:
    return frequency.secs is not None and (now - anchor.at).total_seconds() >= frequency.secs


def next_due(frequency: Frequency, anchor: Anchor) -> str:
    """When the next checkpoint will be due, for ``evald status``."""
    if frequency.every_checkpoint:
        return "every checkpoint"
    parts = []
    if frequency.steps is not None:
        parts.append(f"step >= {anchor.step + frequency.steps}")
    if frequency.epochs is not None:
        parts.append(f"epoch >= {anchor.epoch + frequency.epochs}")
    if frequency.secs is not None:
        moment = anchor.at.timestamp() + frequency.secs
        parts.append(
            f"time >= {datetime.fromtimestamp(moment, anchor.at.tzinfo).isoformat(timespec='seconds')}"
        )
    return " or ".join(parts)
