"""Adaptive frequency: evaluate more often while the watched metric moves, less often while it is flat.

"Moves" means the change between two evaluations exceeds their combined noise (standard errors), so a
wiggle of two points of accuracy on fifty items does not halve the interval. Pure: the planner stores
the interval and the reason, this module only decides them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    step: int | None
    value: float
    stderr: float | None


def noise(a: Point, b: Point) -> float:
    """Standard error of the difference of two independent estimates."""
    return math.hypot(a.stderr or 0.0, b.stderr or 0.0)


@dataclass(frozen=True)
class Interval:
    every_steps: int
    reason: str


def adapt(
    every_steps: int,
    previous: Point,
    current: Point,
    *,
    metric: str,
    min_every: int,
    max_every: int,
    sigmas: float,
) -> Interval:
    """Halve the interval when ``metric`` moved beyond ``sigmas`` × noise since ``previous``; else double."""
    change = abs(current.value - previous.value)
    limit = sigmas * noise(previous, current)
    where = f"step {previous.step} → {current.step}"
    if change > limit:
        new = max(min_every, every_steps // 2)
        return Interval(
            new,
            f"{metric} moved {change:.4g} ({where}), more than {sigmas:g}× its noise {limit / sigmas:.3g}: "
            f"every {new} steps (min {min_every})",
        )
    new = min(max_every, every_steps * 2)
    return Interval(
        new,
        f"{metric} flat: changed {change:.4g} ({where}), within {sigmas:g}× its noise {limit / sigmas:.3g}: "
        f"every {new} steps (max {max_every})",
    )
