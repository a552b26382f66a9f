"""The pure scheduling rules: due or not (and why), adaptive intervals, when a full stage is called for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from daemon.scheduling import adaptive, frequency, stages
from daemon.scheduling.frequency import Anchor, Frequency, Verdict, decide

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def _decide(
    freq: Frequency, anchor: Anchor, step: int | None, *, epoch: int | None = None, secs: float = 0
) -> frequency.Decision:
    return decide(freq, anchor, step=step, epoch=epoch, now=anchor.at + timedelta(seconds=secs))


def test_not_due_says_how_far_it_is() -> None:
    decision = _decide(Frequency(steps=20), Anchor(40, 0, T0), 50)
    assert decision == frequency.Decision(Verdict.SKIPPED, "not due: 10 steps since step 40, freq_steps=20")


def test_steps_trigger_fires_at_the_distance() -> None:
    assert _decide(Frequency(steps=20), Anchor(40, 0, T0), 60).verdict is Verdict.DUE
    assert _decide(Frequency(steps=20), Anchor(40, 0, T0), 75).verdict is Verdict.DUE
    assert _decide(Frequency(steps=20), Anchor(40, 0, T0), 59).verdict is Verdict.SKIPPED


def test_epoch_trigger_counts_epochs_and_says_when_epochs_are_unknown() -> None:
    freq = Frequency(epochs=2)
    assert _decide(freq, Anchor(0, 1, T0), 500, epoch=3).verdict is Verdict.DUE
    assert _decide(freq, Anchor(0, 1, T0), 500, epoch=2).reason == (
        "not due: epoch 2 is 1 after epoch 1, freq_epochs=2"
    )
    assert "epoch unknown (set steps_per_epoch)" in _decide(freq, Anchor(0, 1, T0), 500).reason
    assert frequency.epoch_of(250, None, 100) == 2
    assert frequency.epoch_of(250, 7, 100) == 7
    assert frequency.epoch_of(250, None, None) is None


def test_time_trigger_waits_then_fires() -> None:
    freq = Frequency(secs=600)
    waiting = _decide(freq, Anchor(0, 0, T0), 10, secs=100)
    assert waiting.verdict is Verdict.WAITING
    assert waiting.reason == "waiting for the time trigger: 100 s since the last evaluation, freq_secs=600"
    assert _decide(freq, Anchor(0, 0, T0), 10, secs=600).verdict is Verdict.DUE
    assert frequency.time_due(freq, Anchor(0, 0, T0), T0 + timedelta(seconds=599)) is False
    assert frequency.time_due(freq, Anchor(0, 0, T0), T0 + timedelta(seconds=600)) is True


def test_any_trigger_makes_a_checkpoint_due() -> None:
    freq = Frequency(steps=100, secs=60)
    assert _decide(freq, Anchor(0, 0, T0), 100, secs=1).verdict is Verdict.DUE
    assert _decide(freq, Anchor(0, 0, T0), 10, secs=61).verdict is Verdict.DUE
    both_short = _decide(freq, Anchor(0, 0, T0), 10, secs=5)
    assert both_short.verdict is Verdict.WAITING
    assert "90" not in both_short.reason and "10 steps since step 0, freq_steps=100" in both_short.reason


def test_no_frequency_means_every_checkpoint_and_stepless_folders_are_due() -> None:
    assert _decide(Frequency(), Anchor(0, 0, T0), 1).verdict is Verdict.DUE
    assert _decide(Frequency(steps=50), Anchor(0, 0, T0), None).verdict is Verdict.DUE


def test_a_step_not_after_the_anchor_is_skipped() -> None:
    decision = _decide(Frequency(steps=10), Anchor(40, 0, T0), 40)
    assert decision.verdict is Verdict.SKIPPED and "not after step 40" in decision.reason


def test_next_due_names_every_trigger() -> None:
    text = frequency.next_due(Frequency(steps=20, epochs=1, secs=3600), Anchor(40, 2, T0))
    assert text == "step >= 60 or epoch >= 3 or time >= 2026-11-01T01:00:00+00:00"
    assert frequency.next_due(Frequency(), Anchor(40, 2, T0)) == "every checkpoint"


def _point(step: int, value: float, stderr: float | None = 0.02) -> adaptive.Point:
    return adaptive.Point(step, value, stderr)


@pytest.mark.parametrize(
    ("previous", "current", "every", "expected"),
    [
        (_point(100, 0.40), _point(120, 0.55), 40, 20),  # moved 0.15 >> 2 × 0.028: halve
        (_point(100, 0.40), _point(120, 0.41), 40, 80),  # within the noise: double
        (_point(100, 0.40), _point(120, 0.55), 15, 10),  # never below the minimum
        (_point(100, 0.40), _point(120, 0.40), 150, 160),  # never above the maximum
        (_point(100, 0.40, None), _point(120, 0.40001, None), 40, 20),  # no noise known: any change moves
    ],
)
def test_adaptive_interval(
    previous: adaptive.Point, current: adaptive.Point, every: int, expected: int
) -> None:
    interval = adaptive.adapt(
        every, previous, current, metric="accuracy", min_every=10, max_every=160, sigmas=2.0
    )
    assert interval.every_steps == expected
    assert interval.reason.startswith(
        "accuracy moved" if expected < every or expected == 10 else "accuracy flat"
    )
    assert "accuracy" in interval.reason and "step 100 → 120" in interval.reason


def test_full_stage_by_count_starts_with_the_first() -> None:
    assert [s for s in range(1, 12) if stages.full_by_count(s, 5)] == [1, 6, 11]
    assert all(stages.full_by_count(s, 1) for s in range(1, 5))


def _full(
    history: list[adaptive.Point], current: adaptive.Point, higher_is_better: bool | None = True
) -> str | None:
    return stages.full_after_quick(
        history, current, metric="accuracy", higher_is_better=higher_is_better, sigmas=3.0
    )


def test_full_stage_after_a_new_best_or_an_anomaly_candidate() -> None:
    history = [_point(10, 0.30), _point(20, 0.50), _point(30, 0.48)]
    assert _full([], _point(10, 0.3)) is None
    assert _full(history, _point(40, 0.49)) is None  # noise, not the best
    best = _full(history, _point(40, 0.51))
    assert best is not None and best.startswith("new best quick accuracy 0.51")
    cliff = _full(history, _point(40, 0.10))
    assert cliff is not None and cliff.startswith("anomaly candidate")
    # Lower is better: a new low is the best; no direction: no "best" at all.
    low = [_point(10, 5.0, 0.5), _point(20, 4.0, 0.5)]
    assert "new best" in str(_full(low, _point(30, 3.9, 0.5), higher_is_better=False))
    assert _full(low, _point(30, 3.9, 0.5), higher_is_better=None) is None
