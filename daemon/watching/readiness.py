"""When a checkpoint may be read: the layout's verdict combined with the quiet period or the marker.

Pure: the caller supplies how long the directory has been unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from inference.layouts import Readiness, Verdict


class Decision(enum.StrEnum):
    WAIT = "wait"
    READY = "ready"
    INVALID = "invalid"


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    reason: str


def decide(
    verdict: Verdict,
    *,
    quiet_for: float,
    quiet_secs: float,
    invalid_after_secs: float,
    marker: str | None,
    marker_present: bool,
) -> Outcome:
    """Turn a layout verdict into what to do now.

    With a marker the trainer has said the checkpoint is done, so whatever is wrong is final. Without one,
    a directory must stay unchanged for ``quiet_secs`` before it is read, and one that stays incomplete and
    unchanged for ``invalid_after_secs`` is given up on. A final verdict (a file no trainer writes, such as
    a FIFO) is refused at once.
    """
    if verdict.readiness is Readiness.INVALID and verdict.final:
        return Outcome(Decision.INVALID, verdict.reason)
    if marker is not None:
        if not marker_present:
            return Outcome(Decision.WAIT, f"marker {marker} not written yet")
        if verdict.readiness is Readiness.COMPLETE:
            return Outcome(Decision.READY, f"marker {marker} present")
        return Outcome(Decision.INVALID, f"marker {marker} present but {verdict.reason}")
    if verdict.readiness is Readiness.INCOMPLETE:
        if quiet_for >= invalid_after_secs:
            return Outcome(
                Decision.INVALID, f"still incomplete after {quiet_for:.0f} s unchanged: {verdict.reason}"
            )
        return Outcome(Decision.WAIT, verdict.reason)
    if quiet_for < quiet_secs:
        return Outcome(Decision.WAIT, f"changed {quiet_for:.1f} s ago, quiet period is {quiet_secs:g} s")
    if verdict.readiness is Readiness.INVALID:
        return Outcome(Decision.INVALID, verdict.reason)
    return Outcome(Decision.READY, f"unchanged for {quiet_for:.1f} s")
