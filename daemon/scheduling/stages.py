"""Two-stage evaluation: which due checkpoints also get the full stage, besides the quick one.

Pure rules; the planner applies them when a checkpoint becomes due (every n-th, final) and when a quick
result is stored (new best, anomaly candidate).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from daemon.scheduling.adaptive import Point, noise

QUICK = "quick"
FULL = "full"

#: Queue priorities: quick jobs (and single-stage ones, the only signal their task gives) before full ones.
PRIORITY_QUICK = 1
PRIORITY_FULL = 0


def full_by_count(sequence: int, full_every: int) -> bool:
    """The 1st, (n+1)th, (2n+1)th ... evaluated checkpoint: the first gives the full set a baseline."""
    return (sequence - 1) % full_every == 0


def full_after_quick(
    history: Sequence[Point],
    current: Point,
    *,
    metric: str,
    higher_is_better: bool | None,
    sigmas: float,
) -> str | None:
    """Why a quick result calls for the full stage (a new best or an anomaly candidate), or None.

    ``history`` holds the run's earlier quick results of the task, oldest first.
    """
    if not math.isfinite(current.value):
        return f"anomaly candidate: quick {metric} is {current.value}"
    if not history:
        return None
    previous = history[-1]
    limit = sigmas * noise(previous, current)
    change = current.value - previous.value
    if abs(change) > limit:
        return (
            f"anomaly candidate: quick {metric} {current.value:.4g} vs {previous.value:.4g} at step "
            f"{previous.step}, beyond {sigmas:g}× noise"
        )
    if higher_is_better is not None:
        best = max(history, key=lambda p: p.value if higher_is_better else -p.value)
        better = current.value > best.value if higher_is_better else current.value < best.value
        if better:
            return (
                f"new best quick {metric} {current.value:.4g} "
                f"(previous best {best.value:.4g} at step {best.step})"
            )
    return None
