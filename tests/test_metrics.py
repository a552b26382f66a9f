from __future__ import annotations

import math

import pytest

from inference.errors import TaskInvalid
from inference.metrics import METRICS, EvalRecord, SampleRecord, compute_metrics, resolve_metrics
from inference.spec import MetricValue


def record(*samples: tuple[bool, int, bool], generation_s: float = 2.0) -> EvalRecord:
    return EvalRecord(
        samples=tuple(SampleRecord(correct=c, tokens=t, truncated=tr) for c, t, tr in samples),
        generation_s=generation_s,
        load_s=1.5,
        wall_s=4.0,
    )


RUN = record((True, 10, False), (False, 12, False), (True, 11, False), (False, 32, True))


def value(name: str, run: EvalRecord = RUN) -> MetricValue:
    (result,) = compute_metrics(resolve_metrics([name]), run)
    return result


def test_accuracy_is_a_proportion_with_binomial_stderr() -> None:
    result = value("accuracy")

    assert result == MetricValue(name="accuracy", value=0.5, n=4, stderr=math.sqrt(0.25 / 4))


def test_response_length_mean_and_sample_stderr() -> None:
    result = value("response_length")

    # tokens 10, 12, 11, 32: mean 16.25, sample variance 109.5833…
    assert result.value == pytest.approx(16.25)
    assert result.n == 4
    assert result.stderr == pytest.approx(math.sqrt((6.25**2 + 4.25**2 + 5.25**2 + 15.75**2) / 3 / 4))


def test_truncation_rate() -> None:
    result = value("truncation_rate")

    assert (result.value, result.n) == (0.25, 4)
    assert result.stderr == pytest.approx(math.sqrt(0.25 * 0.75 / 4))


def test_one_sample_has_no_sample_stderr() -> None:
    assert value("response_length", record((True, 7, False))).stderr is None


def test_timing_metrics() -> None:
    assert value("tokens_per_s") == MetricValue(name="tokens_per_s", value=65 / 2.0, n=4, stderr=None)
    assert value("wall_s") == MetricValue(name="wall_s", value=4.0, n=None, stderr=None)
    assert value("load_s") == MetricValue(name="load_s", value=1.5, n=None, stderr=None)
    assert value("tokens_per_s", record((True, 3, False), generation_s=0.0)).value == 0.0


def test_no_samples_gives_zero_n_not_a_crash() -> None:
    empty = record()

    assert value("accuracy", empty) == MetricValue(name="accuracy", value=0.0, n=0, stderr=None)
    assert value("response_length", empty).n == 0


def test_compute_keeps_the_requested_order() -> None:
    names = ["wall_s", "accuracy", "response_length"]

    assert [m.name for m in compute_metrics(resolve_metrics(names), RUN)] == names


def test_unknown_metric_names_it_and_lists_the_known() -> None:
    with pytest.raises(TaskInvalid, match=r"unknown metric 'pass@1' \(known: accuracy, load_s, ") as caught:
        resolve_metrics(["accuracy", "pass@1"])

    assert all(name in str(caught.value) for name in METRICS)


def test_duplicate_metric() -> None:
    with pytest.raises(TaskInvalid, match="metric 'accuracy' is listed twice"):
        resolve_metrics(["accuracy", "accuracy"])
