"""Absolute rules: a value that is not a number, a configured threshold crossed, a drop from the best."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from daemon.anomaly.series import Finding, Point, difference_noise, worse
from daemon.anomaly.settings import Settings


def non_finite(metric: str, points: Sequence[Point]) -> Finding | None:
    """The newest value is NaN or infinite: the checkpoint diverged, or its evaluation broke."""
    current = points[-1]
    if math.isfinite(current.value):
        return None
    return Finding(
        rule="non_finite",
        metric=metric,
        step=current.step,
        value=current.value,
        baseline=None,
        severity="critical",
        message=f"{metric} is {current.value} (a diverged checkpoint?)",
    )


def threshold(
    metric: str, points: Sequence[Point], *, minimum: float | None = None, maximum: float | None = None
) -> Finding | None:
    """The newest value is below the metric's configured ``min`` or above its ``max``
    (``[alerts.thresholds]``)."""
    current = points[-1]
    if not math.isfinite(current.value):
        return None
    if minimum is not None and current.value < minimum:
        bound, side = minimum, "below"
    elif maximum is not None and current.value > maximum:
        bound, side = maximum, "above"
    else:
        return None
    return Finding(
        rule="threshold",
        metric=metric,
        step=current.step,
        value=current.value,
        baseline=bound,
        severity="critical",
        message=f"{metric} {current.value:.4g} is {side} its threshold {bound:.4g}",
    )


#: Points the best is smoothed over (a rolling median): one lucky point is not a best.
BEST_WIDTH = 3


def drops(
    metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings
) -> list[Finding | None]:
    """The drop-from-best finding at every point of ``points``, each judged on the points before it (one
    pass: the smoothed values and the running best serve every prefix)."""
    found: list[Finding | None] = [None] * len(points)
    if higher_is_better is None:
        return found
    sign = 1.0 if higher_is_better else -1.0
    history: list[Point] = []
    level: list[float] = []
    at = top = -1
    for k, current in enumerate(points):
        if (
            len(history) >= s.min_history
            and math.isfinite(current.value)
            # No noise model (a timing): "worse than the best" would page on every slow machine.
            and current.stderr is not None
        ):
            found[k] = _drop(metric, current, history, level, at, top, s, higher_is_better)
        if not math.isfinite(current.value):
            continue
        history.append(current)
        level.append(statistics.median(q.value for q in history[-BEST_WIDTH:]))
        # The first best wins a tie, as ``max`` picks it.
        if at < 0 or sign * level[-1] > sign * level[at]:
            at = len(level) - 1
        if top < 0 or sign * current.value > sign * history[top].value:
            top = len(history) - 1
    return found


def _drop(
    metric: str,
    current: Point,
    history: Sequence[Point],
    level: Sequence[float],
    at: int,
    top: int,
    s: Settings,
    higher_is_better: bool,
) -> Finding | None:
    best_point, best, raw = history[at], level[at], history[top]
    width = min(BEST_WIDTH, at + 1)
    drop = worse(current.value - best, higher_is_better)
    noise = difference_noise(current, [best_point])
    floor = max(s.drop_sigmas * noise, s.relative_floor * abs(best) * s.drop_sigmas, s.absolute_floor)
    if drop <= floor:
        return None
    return Finding(
        rule="drop_from_best",
        metric=metric,
        step=current.step,
        value=current.value,
        baseline=best,
        severity="critical" if drop > 2 * floor else "warning",
        message=(
            f"{metric} {current.value:.4g} is {drop:.4g} worse than its smoothed best {best:.4g} "
            f"(median of {width} checkpoints ending at step {best_point.step}); "
            f"best raw {raw.value:.4g} at step {raw.step}"
        ),
    )


def drop_from_best(
    metric: str, points: Sequence[Point], higher_is_better: bool | None, s: Settings
) -> Finding | None:
    """The newest point is worse than the best so far (smoothed) by more than ``drop_sigmas`` standard
    errors of the difference; the baseline is that best, and its step is where to roll back to.

    The message calls the baseline what it is, a smoothed best (the median of the ``BEST_WIDTH`` points
    ending at its step), and gives the best raw value beside it: a chart's best ring marks the raw one,
    and "best 0.97" beside a ring at 1 reads as a wrong number."""
    return drops(metric, points, higher_is_better, s)[-1]
