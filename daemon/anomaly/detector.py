"""Every detector over one (run, task)'s metric series, at each of its steps in step order.

Results arrive in any order (the backlog runs newest first, backfills land late, two stages interleave),
but a point is judged only on the points before it *in step order*. :func:`judge` therefore judges every
step of the whole series afresh; a late older point changes the verdicts of the steps after it, exactly
as if the checkpoints had been evaluated oldest first. It is one pass per metric (the shift statistics and
the running best are carried along, window rules read a bounded slice), so re-judging a long series on
each stored result stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence

from daemon.anomaly import rl
from daemon.anomaly.robust import robust_z
from daemon.anomaly.rules import drops, non_finite, threshold
from daemon.anomaly.series import Finding, Point
from daemon.anomaly.settings import Settings
from daemon.anomaly.shift import shifts

RL_RULES = (rl.length_explosion, rl.entropy_collapse, rl.reward_hacking, rl.zero_spread_rising)
DEFAULTS = Settings()
#: A metric's configured bounds (minimum, maximum), either may be absent.
Bounds = tuple[float | None, float | None]


def judge(
    series: Mapping[str, Sequence[Point]],
    directions: Mapping[str, bool | None],
    settings: Settings = DEFAULTS,
    thresholds: Mapping[str, Bounds] | None = None,
    since: int | None = None,
) -> dict[int, list[Finding]]:
    """Findings at every step of ``series`` (metric name → points in step order), each step judged on the
    points up to it; keys in step order, an empty list where nothing fired. A metric's ``directions``
    entry says which way is better (``None``: no good direction, any jump counts); ``thresholds`` are the
    absolute bounds configured per metric; with ``since``, only the steps from it on are judged."""
    s = settings
    found: dict[int, list[Finding]] = {}
    crossed: dict[int, list[Finding]] = {}
    at_step: dict[int, dict[str, Sequence[Point]]] = {}
    for metric, points in series.items():
        direction = directions.get(metric)
        moved = shifts(metric, points, direction, s)
        dropped = drops(metric, points, direction, s)
        minimum, maximum = (thresholds or {}).get(metric, (None, None))
        for k, view in _views(points, s.window):
            step = points[k].step
            if since is not None and step < since:
                continue
            here = found.setdefault(step, [])
            at_step.setdefault(step, {})[metric] = view
            bad = non_finite(metric, view)
            if bad is not None:
                here.append(bad)
            elif view[-1].stderr is not None:
                # No noise model (timings, memory): a busy machine is not an anomaly. Thresholds still apply.
                for finding in (robust_z(metric, view, direction, s), dropped[k], *moved[k]):
                    if finding is not None:
                        here.append(finding)
            if minimum is not None or maximum is not None:
                bound = threshold(metric, view, minimum=minimum, maximum=maximum)
                if bound is not None:
                    crossed.setdefault(step, []).append(bound)
    judged: dict[int, list[Finding]] = {}
    for step in sorted(found):
        here = found[step]
        for rule in RL_RULES:
            finding = rule(at_step[step], step, s)
            if finding is not None:
                here.append(finding)
        judged[step] = here + crossed.get(step, [])
    return judged


def detect(
    series: Mapping[str, Sequence[Point]],
    directions: Mapping[str, bool | None],
    settings: Settings = DEFAULTS,
) -> list[Finding]:
    """Findings at the newest step of ``series`` (see :func:`judge`)."""
    ends = [points[-1].step for points in series.values() if points]
    if not ends:
        return []
    newest = max(ends)
    return judge(series, directions, settings, since=newest).get(newest, [])


def _views(points: Sequence[Point], window: int) -> Iterator[tuple[int, Sequence[Point]]]:
    """Each point's index with the slice of ``points`` ending at it that still holds the ``window`` finite
    points before it: what a window rule reads, without copying the whole prefix at every step."""
    finite_at: list[int] = []
    for k, point in enumerate(points):
        start = finite_at[-window] if len(finite_at) >= window else 0
        yield k, points[start : k + 1]
        if math.isfinite(point.value):
            finite_at.append(k)
