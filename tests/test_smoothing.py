"""Smoothing: EMA with TensorBoard's debiasing and a centred window, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from daemon.analysis.smoothing import NONE, Smoothing, ema, moving_window, parse_smoothing
from daemon.errors import SmoothingError


def close(got: list[float], want: list[float]) -> bool:
    if len(got) != len(want):
        return False
    return all(
        (math.isnan(g) and math.isnan(w)) or math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12)
        for g, w in zip(got, want, strict=True)
    )


def test_ema_debiased_by_hand() -> None:
    # w = 0.5: the k-th smoothed value is the mean weighted 1, 2, 4, ... (newest heaviest):
    # s1 = 0.5/0.5 = 1; s2 = 1.25/0.75 = 5/3 = (1 + 2*2)/3; s3 = 2.125/0.875 = 17/7 = (1 + 2*2 + 4*3)/7.
    assert close(ema([1.0, 2.0, 3.0], 0.5), [1.0, 5 / 3, 17 / 7])


def test_ema_first_value_is_not_pulled_to_zero() -> None:
    # Without debiasing the first point would be (1 - 0.9) * 10 = 1.
    assert ema([10.0], 0.9) == pytest.approx([10.0])


def test_ema_constant_series_stays_constant() -> None:
    assert close(ema([0.3] * 6, 0.8), [0.3] * 6)


def test_ema_nan_passes_through_and_is_not_counted() -> None:
    # The NaN is neither smoothed nor counted: the third point is the second finite one,
    # s = (1*1 + 2*3) / 3 = 7/3.
    assert close(ema([1.0, math.nan, 3.0], 0.5), [1.0, math.nan, 7 / 3])
    got = ema([math.inf, 2.0], 0.5)
    assert got[0] == math.inf and got[1] == pytest.approx(2.0)


def test_ema_weight_zero_is_identity() -> None:
    assert ema([1.0, 5.0, -2.0], 0.0) == [1.0, 5.0, -2.0]


def test_ema_rejects_weight_outside_unit_interval() -> None:
    with pytest.raises(SmoothingError, match="outside"):
        ema([1.0], 1.0)


def test_window_centred_shrinks_at_edges() -> None:
    # width 3: [mean(1,2), mean(1,2,6), mean(2,6,3), mean(6,3)]
    assert close(moving_window([1.0, 2.0, 6.0, 3.0], 3), [1.5, 3.0, 11 / 3, 4.5])
    # width 5 over 4 points: the window is cut at both ends.
    assert close(moving_window([1.0, 2.0, 6.0, 3.0], 5), [3.0, 3.0, 3.0, 11 / 3])


def test_window_skips_nan_neighbours_and_keeps_nan_points() -> None:
    assert close(moving_window([1.0, math.nan, 6.0, 3.0], 3), [1.0, math.nan, 4.5, 4.5])


def test_window_of_one_and_empty_series() -> None:
    assert moving_window([4.0, 5.0], 1) == [4.0, 5.0]
    assert moving_window([], 3) == []
    assert ema([], 0.6) == []


def test_window_rejects_even_width() -> None:
    with pytest.raises(SmoothingError, match="odd"):
        moving_window([1.0], 4)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("none", NONE),
        ("ema:0.6", Smoothing("ema", 0.6)),
        (" EMA:0.95 ", Smoothing("ema", 0.95)),
        ("window:5", Smoothing("window", 5.0)),
        ("ema:0", NONE),
        ("window:1", NONE),
    ],
)
def test_parse_smoothing(spec: str, want: Smoothing) -> None:
    assert parse_smoothing(spec) == want


def test_spec_round_trips() -> None:
    for spec in ("none", "ema:0.6", "window:7"):
        assert parse_smoothing(spec).spec == spec


def test_apply_dispatches() -> None:
    assert close(parse_smoothing("ema:0.5").apply([1.0, 2.0, 3.0]), [1.0, 5 / 3, 17 / 7])
    assert close(parse_smoothing("window:3").apply([1.0, 2.0, 6.0, 3.0]), [1.5, 3.0, 11 / 3, 4.5])
    assert NONE.apply([1.0, 2.0]) == [1.0, 2.0]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("gauss:3", "'gauss:3' is not a known spec"),
        ("ema", "'ema' is not a known spec"),
        ("ema:x", "EMA weight 'x' is not a number"),
        ("ema:1", "must be in [0, 1)"),
        ("ema:-0.1", "must be in [0, 1)"),
        ("ema:nan", "must be in [0, 1)"),
        ("window:4", "must be odd"),
        ("window:0", "must be odd"),
        ("window:2.5", "'2.5' is not an integer"),
    ],
)
def test_bad_specs_name_the_spec(spec: str, fragment: str) -> None:
    with pytest.raises(SmoothingError) as info:
        parse_smoothing(spec)
    assert fragment in str(info.value)
    assert "ema:0.6" in str(info.value)  # and say what would be accepted
    assert isinstance(info.value, ValueError)


def test_ema_stderr_through_the_same_weights() -> None:
    # w = 0.5 weighs the points 1, 2, 4 (/7): se = sqrt(1 + 4 + 16)/7 for unit errors.
    got = parse_smoothing("ema:0.5").apply_stderr([1.0, 2.0, 3.0], [1.0, 1.0, 1.0])
    assert got == pytest.approx([1.0, math.sqrt(5) / 3, math.sqrt(21) / 7])


def test_ema_stderr_unknown_stays_unknown_and_nan_points_have_none() -> None:
    smoothing = parse_smoothing("ema:0.5")
    assert smoothing.apply_stderr([1.0, 2.0], [None, 1.0]) == [None, None]
    got = smoothing.apply_stderr([1.0, math.nan, 3.0], [1.0, 9.0, 1.0])
    assert got[1] is None and got[2] == pytest.approx(math.sqrt(5) / 3)


def test_window_stderr_by_hand() -> None:
    # width 3, errors 3, 4, 0: sqrt(9 + 16)/2, sqrt(9 + 16 + 0)/3, sqrt(16 + 0)/2
    got = parse_smoothing("window:3").apply_stderr([1.0, 2.0, 3.0], [3.0, 4.0, 0.0])
    assert got == pytest.approx([2.5, 5 / 3, 2.0])
    assert parse_smoothing("window:3").apply_stderr([1.0, 2.0], [1.0, None]) == [None, None]
    assert NONE.apply_stderr([1.0], [0.5]) == [0.5]
