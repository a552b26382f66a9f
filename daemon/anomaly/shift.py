"""Sustained shifts: EWMA and CUSUM of the residuals from a lagging rolling median, standardised.

A jump that no single point makes (a slow drift) accumulates here. The residual at each point is taken
against the median of the ``window`` points before it, scaled by their MAD or their own noise, whichever is
larger; only the bad direction accumulates. Neither speaks before ``min_history`` points, nor on a metric
without standard errors (timings: their drift is the machine's), nor on one with no good direction:
response length and entropy drift for good reasons in a healthy run (lengths grow as a model learns to
reason), and their failure shapes have rules of their own (``rl``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from daemon.anomaly.series import Finding, Point, difference_noise, finite, robust_scale, worse
from daemon.anomaly.settings import Settings


def residuals(points: Sequence[Point], higher_is_better: bool | None, s: Settings) -> list[float]:
    """Standardised bad-direction residual of each finite point that has ``min_history`` before it."""
    usable = finite(points)
    out: list[float] = []
    for i in range(s.min_history, len(usable)):
        history = usable[max(0, i - s.window) : i]
        baseline = statistics.median(p.value for p in history)
        noise = difference_noise(usable[i], history)
        floor = max(noise, s.relative_floor * abs(baseline), s.absolute_floor)
        scale = robust_scale([p.value for p in history], floor)
        out.append(worse(usable[i].value - baseline, higher_is_better) / scale)
    return out


def _finding(rule: str, metric: str, current: Point, statistic: float, message: str) -> Finding:
    return Finding(
        rule=rule,
        metric=metric,
        step=current.step,
        value=current.value,
        baseline=None,
        severity="warning",
        message=message,
    )


def ewma(metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings) -> Finding | None:
    current = points[-1]
    if higher_is_better is None or current.stderr is None or not math.isfinite(current.value):
        return None
    series = residuals(points, higher_is_better, s)
    if len(series) < 2 or series[-1] <= 0:
        return None
    smoothed = 0.0
    for r in series:
        smoothed = s.ewma_lambda * r + (1 - s.ewma_lambda) * smoothed
    limit = s.ewma_limit * math.sqrt(s.ewma_lambda / (2 - s.ewma_lambda))
    if smoothed <= limit:
        return None
    return _finding(
        "ewma",
        metric,
        current,
        smoothed,
        f"{metric} has been shifting the wrong way (EWMA {smoothed:.2f} > {limit:.2f})",
    )


def cusum(metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings) -> Finding | None:
    current = points[-1]
    if higher_is_better is None or current.stderr is None or not math.isfinite(current.value):
        return None
    series = residuals(points, higher_is_better, s)
    if not series or series[-1] <= 0:
        return None
    total = 0.0
    for r in series:
        total = max(0.0, total + r - s.cusum_k)
    if total <= s.cusum_h:
        return None
    return _finding(
        "cusum",
        metric,
        current,
        total,
        f"{metric} has drifted the wrong way (CUSUM {total:.1f} > {s.cusum_h:g})",
    )
