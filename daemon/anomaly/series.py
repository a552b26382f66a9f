"""Points, findings, and the noise every comparison must clear."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Severity = Literal["info", "warning", "critical"]

#: 1.4826 · MAD estimates the standard deviation of normal data.
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Point:
    step: int
    value: float
    #: Items the value averages over; ``None`` where a count has no meaning.
    n: int | None = None
    #: The value's standard error; ``None`` where it has none (a timing).
    stderr: float | None = None


@dataclass(frozen=True)
class Finding:
    rule: str
    metric: str
    step: int
    value: float
    #: What the value was compared with (a rolling median, the best so far); ``None`` for absolute rules.
    baseline: float | None
    severity: Severity
    message: str


def worse(delta: float, higher_is_better: bool | None) -> float:
    """How much worse a change of ``delta`` is (positive: worse); with no direction, any change counts."""
    if higher_is_better is None:
        return abs(delta)
    return -delta if higher_is_better else delta


def point_noise(points: Sequence[Point]) -> float:
    """A typical standard error of ``points`` (their median); 0 when none has one."""
    errors = [p.stderr for p in points if p.stderr is not None and math.isfinite(p.stderr)]
    return statistics.median(errors) if errors else 0.0


def difference_noise(current: Point, history: Sequence[Point]) -> float:
    """Standard error of ``current`` minus a baseline made of ``history``: both points' sampling noise.
    A 2-point accuracy wiggle on 50 items is noise (stderr ~0.07), not an anomaly."""
    now = current.stderr if current.stderr is not None and math.isfinite(current.stderr) else 0.0
    return math.hypot(now, point_noise(history))


def robust_scale(values: Sequence[float], floor: float) -> float:
    """1.4826 · MAD of ``values``, at least ``floor`` (a plateau's MAD is 0: it must not divide by 0)."""
    if len(values) < 2:
        return floor
    centre = statistics.median(values)
    mad = statistics.median(abs(v - centre) for v in values)
    return max(MAD_TO_SIGMA * mad, floor)


def finite(points: Sequence[Point]) -> list[Point]:
    return [p for p in points if math.isfinite(p.value)]


def trend_baseline(history: Sequence[Point], step: int) -> tuple[float, list[float]]:
    """The value expected at ``step`` from ``history``: its rolling median moved along its Theil–Sen slope
    (the median of the pairwise slopes), and ``history``'s residuals from that line. A curve that rises or
    decays steadily (accuracy learning, entropy falling) is not a jump; the median and the median slope
    each ignore up to a quarter of odd points."""
    steps = [p.step for p in history]
    values = [p.value for p in history]
    slopes = [
        (values[j] - values[i]) / (steps[j] - steps[i])
        for i in range(len(history))
        for j in range(i + 1, len(history))
        if steps[j] != steps[i]
    ]
    slope = statistics.median(slopes) if slopes else 0.0
    centre_step = statistics.median(steps)
    centre = statistics.median(values)
    residuals = [v - (centre + slope * (t - centre_step)) for t, v in zip(steps, values, strict=True)]
    return centre + slope * (step - centre_step), residuals
