"""The detectors on hand-made series: each fires on its shape and stays quiet on noise."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from daemon.anomaly import Finding, Point, Settings, detect, rl
from daemon.anomaly.robust import robust_z
from daemon.anomaly.rules import drop_from_best, non_finite, threshold
from daemon.anomaly.shift import cusum, ewma

S = Settings()


def series(values: Sequence[float], stderr: float | None = 0.01, n: int | None = 500) -> list[Point]:
    return [Point((i + 1) * 100, v, n, stderr) for i, v in enumerate(values)]


PLATEAU = [0.60, 0.61, 0.60, 0.59, 0.60, 0.61, 0.60, 0.60]


def rules(found: list[Finding]) -> set[tuple[str, str]]:
    return {(f.rule, f.metric) for f in found}


def test_a_flat_plateau_does_not_divide_by_zero() -> None:
    flat = series([0.5] * 10, stderr=0.0)

    assert robust_z("accuracy", flat, True, S) is None
    # The floor (1% of the level) keeps the scale positive: a real jump from a dead-flat line still counts.
    jumped = robust_z("accuracy", [*flat, Point(1100, 0.3, 500, 0.0)], True, S)
    assert jumped is not None and jumped.baseline == 0.5


def test_a_two_point_wiggle_on_fifty_items_is_noise() -> None:
    # 50 items: the standard error is ~0.07, so 0.60 -> 0.56 is well inside it.
    small = series([0.60, 0.62, 0.60, 0.58, 0.60, 0.62, 0.60, 0.60, 0.56], stderr=0.07, n=50)

    assert detect({"accuracy": small}, {"accuracy": True}) == []


def test_a_cliff_fires_robust_z_and_drop_from_best_with_the_best_step() -> None:
    points = series([*PLATEAU, 0.30])

    found = {f.rule: f for f in detect({"accuracy": points}, {"accuracy": True})}

    assert {"robust_z", "drop_from_best"} <= set(found)
    assert found["robust_z"].severity == "critical"
    # The best of the 3-point running median (one lucky point is not a best): the first two, 0.605.
    assert found["drop_from_best"].baseline == pytest.approx(0.605)
    assert "step" in found["drop_from_best"].message


def test_drop_from_best_says_its_baseline_is_a_smoothed_best_and_gives_the_raw_best() -> None:
    """Issue 20: the text said "best 0.97 (step 720)" while the chart's ring said best 1 at 720. The
    baseline is the best of a running median: the message says so and names the raw best beside it."""
    values = [0.6, 0.9, 0.95, 0.97, 0.96, 1.0, 0.97]
    points = [Point(120 * (i + 1), v, 100, 0.02) for i, v in enumerate(values)]
    points.append(Point(960, 0.2, 100, 0.04))

    found = drop_from_best("accuracy", points, True, S)

    assert found is not None and found.baseline == pytest.approx(0.97)
    assert found.message == (
        "accuracy 0.2 is 0.77 worse than its smoothed best 0.97 (median of 3 checkpoints ending at step "
        "720); best raw 1 at step 720"
    )


def test_the_good_direction_is_not_an_anomaly() -> None:
    up = series([*PLATEAU, 0.90])

    assert detect({"accuracy": up}, {"accuracy": True}) == []
    # The same jump in a lower-is-better metric is one.
    assert ("robust_z", "nll") in rules(detect({"nll": up}, {"nll": False}))


def test_a_steady_trend_is_not_a_jump() -> None:
    decaying = series([1.0 * 0.93**i for i in range(12)], stderr=0.003)

    assert robust_z("entropy", decaying, None, S) is None


def test_a_slow_drift_is_caught_by_cusum_after_the_warm_up() -> None:
    drifting = series([*PLATEAU, 0.58, 0.56, 0.54, 0.52, 0.50], stderr=0.015)

    assert cusum("accuracy", drifting[:6], True, S) is None
    assert cusum("accuracy", drifting, True, S) is not None
    assert ewma("accuracy", drifting, True, S) is not None
    # Not on a metric with no good direction: lengths drift in healthy runs.
    assert cusum("response_length", drifting, None, S) is None


def test_nothing_speaks_during_the_warm_up() -> None:
    short = series([0.6, 0.6, 0.2])

    assert detect({"accuracy": short}, {"accuracy": True}) == []


def test_nan_and_inf_are_critical() -> None:
    for bad in (math.nan, math.inf):
        found = non_finite("perplexity", series([*PLATEAU, bad]))
        assert found is not None and found.severity == "critical"
    # A NaN earlier in the series does not poison the baseline of the next point.
    recovered = series([*PLATEAU, math.nan, 0.60])
    assert detect({"accuracy": recovered}, {"accuracy": True}) == []


def test_threshold() -> None:
    points = series([0.5, 0.2])

    found = threshold("accuracy", points, minimum=0.3)

    assert found is not None and found.baseline == 0.3 and "below" in found.message
    assert threshold("accuracy", points, maximum=0.9) is None


def run(**metrics: Sequence[float]) -> dict[str, list[Point]]:
    errors = {"response_length": 5.0, "entropy": 0.005, "truncation_rate": 0.005}
    return {name: series(values, stderr=errors.get(name, 0.01)) for name, values in metrics.items()}


def test_length_explosion_needs_length_and_truncation_up_and_accuracy_flat() -> None:
    lengths = [400, 410, 405, 400, 398, 402, 404, 401, 900]
    cut_up = [0.01] * 8 + [0.25]
    exploded = run(response_length=lengths, truncation_rate=cut_up, accuracy=[*PLATEAU, 0.60])

    found = rl.length_explosion(exploded, 900, S)

    assert found is not None and found.metric == "response_length" and found.baseline == pytest.approx(401.5)
    assert rl.length_explosion(run(response_length=lengths, truncation_rate=[0.01] * 9), 900, S) is None
    learning = run(response_length=lengths, truncation_rate=cut_up, accuracy=[*PLATEAU, 0.85])
    assert rl.length_explosion(learning, 900, S) is None


def test_entropy_collapse_unless_accuracy_rises() -> None:
    entropy = [0.60, 0.59, 0.61, 0.60, 0.58, 0.60, 0.59, 0.60, 0.05]

    assert rl.entropy_collapse(run(entropy=entropy, accuracy=[*PLATEAU, 0.60]), 900, S) is not None
    # The toy model's own learning: entropy falls as accuracy jumps.
    assert rl.entropy_collapse(run(entropy=entropy, accuracy=[*PLATEAU, 0.90]), 900, S) is None


def test_reward_up_while_accuracy_down_is_reward_hacking() -> None:
    hacked = run(reward=[*PLATEAU, 0.80], accuracy=[*PLATEAU, 0.45])
    honest = run(reward=[*PLATEAU, 0.80], accuracy=[*PLATEAU, 0.80])

    found = rl.reward_hacking(hacked, 900, S)

    assert found is not None and found.severity == "critical"
    assert rl.reward_hacking(honest, 900, S) is None


def test_zero_spread_groups_rising() -> None:
    rising = run(group_zero_spread=[0.30, 0.31, 0.29, 0.30, 0.32, 0.30, 0.31, 0.30, 0.70])

    assert rl.zero_spread_rising(rising, 900, S) is not None
    low = run(group_zero_spread=[0.10, 0.11, 0.09, 0.10, 0.12, 0.10, 0.11, 0.10, 0.30])
    assert rl.zero_spread_rising(low, 900, S) is None


def test_detect_reads_only_metrics_at_the_newest_step() -> None:
    stale = series([*PLATEAU, 0.1])[:-1]
    fresh = series([*PLATEAU, 0.30])
    fresh = [Point(p.step + 100, p.value, p.n, p.stderr) for p in fresh]

    found = detect({"accuracy": fresh, "reward": stale}, {"accuracy": True, "reward": True})

    assert {f.metric for f in found} == {"accuracy"}
    assert {f.step for f in found} == {1000}


def test_a_timing_without_standard_errors_is_not_worse_than_its_best() -> None:
    # A busy machine slows the job: no noise model says how much is normal, so only a threshold speaks.
    slow = series([10.0, 10.4, 9.8, 10.1, 10.3, 9.9, 10.2, 16.0], stderr=None, n=None)

    assert drop_from_best("wall_s", slow, False, S) is None
    assert cusum("wall_s", slow, False, S) is None and ewma("wall_s", slow, False, S) is None
    assert detect({"wall_s": slow}, {"wall_s": False}) == []
    assert threshold("wall_s", slow, maximum=15.0) is not None
    assert rules(detect({"wall_s": [*slow[:-1], Point(800, math.nan)]}, {"wall_s": False})) == {
        ("non_finite", "wall_s")
    }
