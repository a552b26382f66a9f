"""lm-eval's metric keys as evald metric names: one table, both ways.

lm-eval reports a metric as ``METRIC,FILTER`` (``acc,none``, ``exact_match,strict-match``) and its
standard error as ``METRIC_stderr,FILTER``. evald stores ``METRIC`` when the filter is ``none`` and
``METRIC_SHORT`` otherwise, where SHORT is the filter's entry in :data:`FILTER_SHORT_NAMES` or, for a
filter not in it, the filter's name with every run of characters other than letters and digits made one
``_``. A job that runs several lm-eval tasks (a group, or a task with subtasks) prefixes each name with its
task: ``mmlu_anatomy/acc``.

Two keys may become one name (filters ``boxed-digits`` and ``boxed_digits``, or ``strict-match`` beside a
filter named ``strict``): :func:`collisions` finds them, and such a task is refused (by ``config check``
where its YAML can be read, else by the job, naming both keys) rather than one result dropped.

=====================================  ===================
lm-eval key                            evald metric
=====================================  ===================
``acc,none``                           ``acc``
``acc_norm,none``                      ``acc_norm``
``exact_match,strict-match``           ``exact_match_strict``
``exact_match,flexible-extract``       ``exact_match_flexible``
``exact_match,get-answer``             ``exact_match_get_answer``
``word_perplexity,none``               ``word_perplexity``
``byte_perplexity,none``               ``byte_perplexity``
``bits_per_byte,none``                 ``bits_per_byte``
``pass@1,create_test``                 ``pass@1_create_test``
=====================================  ===================
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NO_FILTER = "none"

#: Filters common in lm-eval's own tasks, shortened.
FILTER_SHORT_NAMES: Mapping[str, str] = {
    "strict-match": "strict",
    "flexible-extract": "flexible",
}

#: Which way lm-eval's common metrics improve (evald's anomaly detectors and "new best" read this).
DIRECTIONS: Mapping[str, bool] = {
    "acc": True,
    "acc_norm": True,
    "acc_mutual_info": True,
    "exact_match": True,
    "f1": True,
    "mcc": True,
    "bleu": True,
    "chrf": True,
    "rouge1": True,
    "rouge2": True,
    "rougeL": True,
    "ter": False,
    "perplexity": False,
    "word_perplexity": False,
    "byte_perplexity": False,
    "bits_per_byte": False,
}

_SEPARATORS = re.compile(r"[^A-Za-z0-9]+")


def split_key(key: str) -> tuple[str, str] | None:
    """``("exact_match", "strict-match")`` for ``exact_match,strict-match``; ``None`` for a key that is not
    a metric (``alias``, ``sample_len``) or is a standard error."""
    metric, comma, filter_name = key.partition(",")
    if not comma or not metric or metric.endswith("_stderr"):
        return None
    return metric, filter_name


def filter_suffix(filter_name: str) -> str:
    short = FILTER_SHORT_NAMES.get(filter_name)
    return short if short is not None else _SEPARATORS.sub("_", filter_name).strip("_")


def evald_name(metric: str, filter_name: str, task: str | None = None) -> str:
    """The evald metric for lm-eval's ``metric,filter`` (of ``task``, when the job ran several)."""
    name = metric if filter_name == NO_FILTER else f"{metric}_{filter_suffix(filter_name)}"
    return name if task is None else f"{task}/{name}"


@dataclass(frozen=True)
class Collision:
    """Two lm-eval ``(metric, filter)`` keys that map to one evald metric ``name``."""

    name: str
    first: tuple[str, str]
    second: tuple[str, str]

    def describe(self) -> str:
        (metric, one), (other_metric, two) = self.first, self.second
        what = (
            f"filters {one!r} and {two!r} of metric {metric!r}"
            if metric == other_metric
            else f"metric {metric!r} with filter {one!r} and metric {other_metric!r} with filter {two!r}"
        )
        return (
            f"lm-eval keys '{metric},{one}' and '{other_metric},{two}' ({what}) both map to evald metric "
            f"{self.name!r}, so one result would be lost: rename one in the task's YAML"
        )


def collisions(keys: Iterable[tuple[str, str]], task: str | None = None) -> tuple[Collision, ...]:
    """Every pair among ``keys`` (lm-eval ``(metric, filter)``, of ``task`` when prefixed) that map to one
    evald name: the first key seen for a name against each later one."""
    seen: dict[str, tuple[str, str]] = {}
    found: list[Collision] = []
    for key in keys:
        name = evald_name(*key, task)
        first = seen.setdefault(name, key)
        if first != key:
            found.append(Collision(name, first, key))
    return tuple(found)


def stderr_key(metric: str, filter_name: str) -> str:
    return f"{metric}_stderr,{filter_name}"


def lm_eval_keys(stored: Iterable[str], candidates: Iterable[tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Each stored (unprefixed) evald name's lm-eval ``(metric, filter)``: found among ``candidates`` (the
    task's configured metrics × filters), else read as a metric with no filter."""
    known = {evald_name(metric, filter_name): (metric, filter_name) for metric, filter_name in candidates}
    return {name: known.get(name, (name, NO_FILTER)) for name in stored}


def direction(name: str) -> bool | None:
    """Which way an evald name mapped from lm-eval improves; ``None`` if the table does not say."""
    base = name.rpartition("/")[2]
    if base in DIRECTIONS:
        return DIRECTIONS[base]
    # exact_match_strict: the metric before a filter suffix; the longest known metric wins (acc_norm_x).
    found = [metric for metric in DIRECTIONS if base.startswith(metric + "_")]
    return DIRECTIONS[max(found, key=len)] if found else None
