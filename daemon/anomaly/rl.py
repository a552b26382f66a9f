"""RL rules: the failure shapes of policy-gradient training, read across a run's metrics at one step.

Each compares the newest point of a metric with the median of the ``window`` points before it, and counts a
change only beyond ``noise_sigmas`` standard errors of the difference.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from daemon.anomaly.series import Finding, Point, difference_noise, finite
from daemon.anomaly.settings import Settings

Series = Mapping[str, Sequence[Point]]


@dataclass(frozen=True)
class Change:
    now: float
    baseline: float
    #: ``now - baseline`` in standard errors of the difference (inf when neither has an error).
    sigmas: float


def change(points: Sequence[Point] | None, step: int, s: Settings) -> Change | None:
    """The newest point against its rolling median, if the series has a finite point at ``step``."""
    if not points or points[-1].step != step or not math.isfinite(points[-1].value):
        return None
    history = finite(points[:-1])[-s.window :]
    if len(history) < s.min_history:
        return None
    baseline = statistics.median(p.value for p in history)
    delta = points[-1].value - baseline
    noise = difference_noise(points[-1], history)
    sigmas = delta / noise if noise > 0 else (math.inf if delta > 0 else -math.inf if delta < 0 else 0.0)
    return Change(points[-1].value, baseline, sigmas)


def _finding(rule: str, metric: str, step: int, c: Change, severity: str, message: str) -> Finding:
    return Finding(
        rule=rule,
        metric=metric,
        step=step,
        value=c.now,
        baseline=c.baseline,
        severity=severity,  # type: ignore[arg-type]
        message=message,
    )


def length_explosion(series: Series, step: int, s: Settings) -> Finding | None:
    """Responses much longer (and more often cut off) while accuracy does not improve: the policy rambles."""
    length = change(series.get("response_length"), step, s)
    if length is None or length.baseline <= 0:
        return None
    if length.now < s.length_ratio * length.baseline or length.sigmas <= s.noise_sigmas:
        return None
    truncation = change(series.get("truncation_rate"), step, s)
    if truncation is not None and truncation.sigmas <= s.noise_sigmas:
        return None
    accuracy = change(series.get("accuracy"), step, s)
    if accuracy is not None and accuracy.sigmas > s.noise_sigmas:
        return None
    cut = f", truncation {truncation.baseline:.3g} -> {truncation.now:.3g}" if truncation else ""
    return _finding(
        "length_explosion",
        "response_length",
        step,
        length,
        "warning",
        f"response length {length.baseline:.4g} -> {length.now:.4g} tokens{cut}, accuracy not improving",
    )


def entropy_collapse(series: Series, step: int, s: Settings) -> Finding | None:
    """Entropy falls to a fraction of its recent level without accuracy rising: exploration has stopped."""
    entropy = change(series.get("entropy"), step, s)
    if entropy is None or entropy.baseline <= 0:
        return None
    if entropy.now > s.entropy_ratio * entropy.baseline or -entropy.sigmas <= s.noise_sigmas:
        return None
    accuracy = change(series.get("accuracy"), step, s)
    if accuracy is not None and accuracy.sigmas > s.noise_sigmas:
        return None
    return _finding(
        "entropy_collapse",
        "entropy",
        step,
        entropy,
        "critical",
        f"policy entropy collapsed {entropy.baseline:.3g} -> {entropy.now:.3g} nats/token, "
        "accuracy not improving",
    )


def reward_hacking(series: Series, step: int, s: Settings) -> Finding | None:
    """Reward up while accuracy is down, both beyond noise: the policy is gaming the reward."""
    reward = change(series.get("reward"), step, s)
    accuracy = change(series.get("accuracy"), step, s)
    if reward is None or accuracy is None:
        return None
    if reward.sigmas <= s.noise_sigmas or -accuracy.sigmas <= s.noise_sigmas:
        return None
    return _finding(
        "reward_hacking",
        "reward",
        step,
        reward,
        "critical",
        f"reward {reward.baseline:.4g} -> {reward.now:.4g} "
        f"while accuracy {accuracy.baseline:.4g} -> {accuracy.now:.4g}",
    )


def zero_spread_rising(series: Series, step: int, s: Settings) -> Finding | None:
    """More GRPO groups whose completions all got the same reward: fewer prompts still teach anything."""
    spread = change(series.get("group_zero_spread"), step, s)
    if spread is None or spread.now < s.zero_spread_level or spread.sigmas <= s.noise_sigmas:
        return None
    return _finding(
        "zero_spread_rising",
        "group_zero_spread",
        step,
        spread,
        "warning",
        f"share of prompts with no reward spread {spread.baseline:.3g} -> {spread.now:.3g}",
    )
