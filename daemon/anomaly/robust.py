"""Robust z-score: the newest point's residual from the rolling median of the points before it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from daemon.anomaly.series import (
    Finding,
    Point,
    difference_noise,
    finite,
    robust_scale,
    trend_baseline,
    worse,
)
from daemon.anomaly.settings import Settings


def robust_z(
    metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings
) -> Finding | None:
    """A sudden jump the wrong way: residual over the window's MAD (at least the points' own noise), and
    larger than ``noise_sigmas`` standard errors of the difference."""
    current = points[-1]
    history = finite(points[:-1])[-s.window :]
    if len(history) < s.min_history or not math.isfinite(current.value):
        return None
    noise = difference_noise(current, history)
    values = [p.value for p in history]
    median = statistics.median(values)
    trend, spread = trend_baseline(history, current.step)
    # A jump must stand out both from the flat window and from its trend: a steadily decaying entropy is
    # far from its median but on its line; a saturating accuracy is below its line but not its median.
    candidates = []
    for baseline, scatter in ((median, values), (trend, spread)):
        floor = max(noise, s.relative_floor * abs(baseline), s.absolute_floor)
        bad = worse(current.value - baseline, higher_is_better)
        candidates.append((bad / robust_scale(scatter, floor), bad, baseline))
    z, bad, baseline = min(candidates)
    if z <= s.z_threshold or bad <= s.noise_sigmas * noise:
        return None
    return Finding(
        rule="robust_z",
        metric=metric,
        step=current.step,
        value=current.value,
        baseline=baseline,
        severity="critical" if z > 2 * s.z_threshold else "warning",
        message=(
            f"{metric} {current.value:.4g} against a rolling median of {baseline:.4g} "
            f"({z:.1f} robust sigmas off)"
        ),
    )
