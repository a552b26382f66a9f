"""Every detector over one (run, task)'s metric series at its newest step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from daemon.anomaly import rl
from daemon.anomaly.robust import robust_z
from daemon.anomaly.rules import drop_from_best, non_finite
from daemon.anomaly.series import Finding, Point
from daemon.anomaly.settings import Settings
from daemon.anomaly.shift import cusum, ewma

RL_RULES = (rl.length_explosion, rl.entropy_collapse, rl.reward_hacking, rl.zero_spread_rising)
DEFAULTS = Settings()


def detect(
    series: Mapping[str, Sequence[Point]],
    directions: Mapping[str, bool | None],
    settings: Settings = DEFAULTS,
) -> list[Finding]:
    """Findings at the newest step of ``series`` (metric name → points in step order). A metric's
    ``directions`` entry says which way is better (``None``: no good direction, any jump counts)."""
    ends = [points[-1].step for points in series.values() if points]
    if not ends:
        return []
    step = max(ends)
    findings: list[Finding] = []
    for metric, points in series.items():
        if not points or points[-1].step != step:
            continue
        bad = non_finite(metric, points)
        if bad is not None:
            findings.append(bad)
            continue
        if points[-1].stderr is None:
            # No noise model (timings, memory): a busy machine is not an anomaly. Thresholds still apply.
            continue
        direction = directions.get(metric)
        for check in (robust_z, drop_from_best, ewma, cusum):
            found = check(metric, points, direction, settings)
            if found is not None:
                findings.append(found)
    for rule in RL_RULES:
        found = rule(series, step, settings)
        if found is not None:
            findings.append(found)
    return findings
