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


Shifts = tuple[Finding | None, Finding | None]


def shifts(metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings) -> list[Shifts]:
    """(EWMA, CUSUM) finding at every point of ``points``, each judged on the points up to it.

    One pass: a residual depends only on the points before it, so the residuals of the whole series are
    those of every prefix, and both statistics are running sums over them. Judging a series of n points at
    each of its steps costs O(n · window), not O(n² · window).
    """
    found: list[Shifts] = [(None, None)] * len(points)
    if higher_is_better is None:
        return found
    usable = [k for k, p in enumerate(points) if math.isfinite(p.value)]
    smoothed = total = 0.0
    limit = s.ewma_limit * math.sqrt(s.ewma_lambda / (2 - s.ewma_lambda))
    for count, r in enumerate(residuals(points, higher_is_better, s), start=1):
        at = usable[s.min_history + count - 1]
        smoothed = s.ewma_lambda * r + (1 - s.ewma_lambda) * smoothed
        total = max(0.0, total + r - s.cusum_k)
        current = points[at]
        if current.stderr is None or r <= 0:
            continue
        moved = None
        if count >= 2 and smoothed > limit:
            message = f"{metric} has been shifting the wrong way (EWMA {smoothed:.2f} > {limit:.2f})"
            moved = _finding("ewma", metric, current, smoothed, message)
        drifted = None
        if total > s.cusum_h:
            message = f"{metric} has drifted the wrong way (CUSUM {total:.1f} > {s.cusum_h:g})"
            drifted = _finding("cusum", metric, current, total, message)
        found[at] = (moved, drifted)
    return found


def ewma(metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings) -> Finding | None:
    """A sustained shift the wrong way: the exponentially weighted mean of the standardised residuals from
    a lagging rolling median passes its control limit."""
    return shifts(metric, points, higher_is_better, s)[-1][0]


def cusum(metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings) -> Finding | None:
    """A slow drift the wrong way: the cumulative sum of the standardised residuals beyond their slack
    passes its decision limit, though no single point stands out."""
    return shifts(metric, points, higher_is_better, s)[-1][1]
