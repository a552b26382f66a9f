"""The metric registry: ``name → metric``.

Metrics are pure functions over plain records (:class:`EvalRecord`), with no model and no torch, so
each one is tested on hand-made data. Names are stable and lower-case: results, alerts and the API use
them. ``pass@K`` and ``maj@K`` take their K from the name (K at most the task's ``n_samples``).

Add a metric by writing a :class:`Metric` in the module of its family and listing it in :data:`METRICS`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from inference.errors import TaskInvalid
from inference.harness.names import direction as harness_direction
from inference.metrics.accuracy import Accuracy, ExactMatch
from inference.metrics.base import DocumentRecord, EvalRecord, Metric, SampleRecord, present
from inference.metrics.bleu import Bleu
from inference.metrics.code import FAILURES, TestPassRate, VerdictRate
from inference.metrics.entropy import Entropy
from inference.metrics.length import (
    ResponseLength,
    ResponseLengthCorrect,
    ResponseLengthIncorrect,
    TruncationRate,
)
from inference.metrics.likelihood import BitsPerByte, BytePerplexity, Nll, Perplexity, WordPerplexity
from inference.metrics.passk import MajorityAtK, PassAtK
from inference.metrics.reward import GroupRewardStd, GroupZeroSpread, Reward, RewardPercentile, RewardStd
from inference.metrics.throughput import BatchLatency, LoadTime, PeakMemory, TokensPerSecond, WallTime
from inference.spec import MetricValue, TaskKind

METRICS: Mapping[str, Metric] = {
    metric.name: metric
    for metric in (
        Accuracy(),
        ExactMatch(),
        Reward(),
        RewardStd(),
        RewardPercentile(10),
        RewardPercentile(50),
        RewardPercentile(90),
        Entropy(),
        GroupRewardStd(),
        GroupZeroSpread(),
        ResponseLength(),
        ResponseLengthCorrect(),
        ResponseLengthIncorrect(),
        TruncationRate(),
        Bleu(),
        TestPassRate(),
        *(VerdictRate(verdict) for verdict in FAILURES),
        Perplexity(),
        Nll(),
        WordPerplexity(),
        BytePerplexity(),
        BitsPerByte(),
        TokensPerSecond(),
        BatchLatency(50),
        BatchLatency(95),
        PeakMemory(),
        LoadTime(),
        WallTime(),
    )
}

#: Metrics named with a parameter: ``pass@8`` is pass@k with k = 8.
_PARAMETRISED = re.compile(r"(?P<family>pass|maj)@(?P<k>[1-9][0-9]{0,3})")

#: Metrics computed from rewards: a task with any of them computes a reward per response.
REWARD_METRICS = frozenset(
    {"reward", "reward_std", "reward_p10", "reward_p50", "reward_p90"}
    | {"group_reward_std", "group_zero_spread"}
)

DEFAULT_METRICS: Mapping[TaskKind, tuple[str, ...]] = {
    "generate": ("accuracy", "response_length", "truncation_rate", "tokens_per_s", "wall_s"),
    "code": (
        "pass@1",
        "test_pass_rate",
        *(f"{verdict}_rate" for verdict in FAILURES),
        "response_length",
        "truncation_rate",
        "tokens_per_s",
        "wall_s",
    ),
    "likelihood": ("perplexity", "nll", "tokens_per_s", "wall_s"),
    # Every metric lm-eval reports is stored: nothing to choose.
    "lm_eval": (),
}


def known_names() -> str:
    return ", ".join([*sorted(METRICS), "pass@K", "maj@K"])


def metric(name: str) -> Metric:
    """The metric called ``name``; an unknown name is :class:`TaskInvalid` listing the known ones."""
    if name in METRICS:
        return METRICS[name]
    match = _PARAMETRISED.fullmatch(name)
    if match is None:
        raise TaskInvalid(f"unknown metric {name!r} (known: {known_names()})")
    k = int(match["k"])
    return PassAtK(k) if match["family"] == "pass" else MajorityAtK(k)


def higher_is_better(name: str) -> bool | None:
    """Which way ``name`` improves (``None``: no good direction, or a metric known neither to the registry
    nor to the lm-eval name table)."""
    try:
        return metric(name).higher_is_better
    except TaskInvalid:
        return harness_direction(name)


def resolve_metrics(
    names: Iterable[str], *, kind: TaskKind = "generate", n_samples: int = 1
) -> tuple[Metric, ...]:
    """The metrics named, in order, checked against the task they belong to."""
    metrics: list[Metric] = []
    for name in names:
        found = metric(name)
        if any(m.name == name for m in metrics):
            raise TaskInvalid(f"metric {name!r} is listed twice")
        if kind not in found.kinds:
            usable = ", ".join(sorted(n for n, m in METRICS.items() if kind in m.kinds))
            raise TaskInvalid(f"metric {name!r} does not apply to a {kind} task (those that do: {usable})")
        if n_samples < found.min_samples_per_prompt:
            raise TaskInvalid(
                f"metric {name!r} needs n_samples >= {found.min_samples_per_prompt} completions per prompt, "
                f"the task has n_samples = {n_samples}"
            )
        metrics.append(found)
    return tuple(metrics)


def compute_metrics(metrics: Iterable[Metric], record: EvalRecord) -> tuple[MetricValue, ...]:
    """Every metric's value. One computed over no samples (``response_length_correct`` when no answer was
    correct) is kept as ``n = 0`` with no number, so the user sees "no samples" at that step rather than a
    series that silently stops; a timing that was not measured (``peak_memory_mb`` on a CPU,
    ``tokens_per_s`` with no time in the model) is left out."""
    values = ((metric, metric.compute(record)) for metric in metrics)
    return tuple(value for metric, value in values if present(value) or metric.reports_no_samples)


__all__ = [
    "DEFAULT_METRICS",
    "METRICS",
    "REWARD_METRICS",
    "DocumentRecord",
    "EvalRecord",
    "Metric",
    "SampleRecord",
    "TaskKind",
    "compute_metrics",
    "higher_is_better",
    "metric",
    "resolve_metrics",
]
