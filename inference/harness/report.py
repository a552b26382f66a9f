"""lm-eval's results and per-sample logs as evald metrics and samples: plain dicts in, plain data out.

``simple_evaluate`` returns ``results[task]["METRIC,FILTER"]`` with ``"METRIC_stderr,FILTER"`` beside it,
``n-samples[task]["effective"]`` (documents evaluated) and, with ``log_samples``, ``samples[task]``: one
entry per document and filter holding the request's ``arguments``, the model's ``resps``, the
``filtered_resps`` the metrics read, the ``target`` and each metric's per-document value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inference.errors import TaskInvalid
from inference.excerpt import cut_text
from inference.harness.names import NO_FILTER, Collision, evald_name, split_key, stderr_key
from inference.spec import MetricValue, SampleOutput


def _number(value: Any) -> float | None:
    """A float for lm-eval's numbers (numpy's included); ``None`` for "N/A", lists and the like."""
    if value is None or isinstance(value, (bool, str)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def documents(task: str, results: Mapping[str, Any]) -> int | None:
    """Documents ``task`` evaluated: lm-eval's effective count, summed over a group's subtasks."""
    counts: Mapping[str, Mapping[str, Any]] = results.get("n-samples", {})
    if task in counts:
        effective = counts[task].get("effective")
        return int(effective) if isinstance(effective, int) else None
    children: Sequence[str] = results.get("group_subtasks", {}).get(task, ())
    found = [documents(child, results) for child in children]
    return sum(n for n in found if n is not None) if found and None not in found else None


def metric_values(results: Mapping[str, Any]) -> tuple[MetricValue, ...]:
    """Every metric lm-eval reported, with its standard error and n; names prefixed by their task when
    the job ran more than one task (a group's subtasks, say). Two keys that map to one name raise
    :class:`TaskInvalid` naming both: storing one of them would silently drop the other."""
    per_task: Mapping[str, Mapping[str, Any]] = results.get("results", {})
    prefixed = len(per_task) > 1
    values: list[MetricValue] = []
    keys: dict[str, tuple[str, str]] = {}
    for task, reported in per_task.items():
        n = documents(task, results)
        for key, raw in reported.items():
            parts = split_key(key)
            value = _number(raw)
            if parts is None or value is None:
                continue
            metric, filter_name = parts
            name = evald_name(metric, filter_name, task if prefixed else None)
            first = keys.setdefault(name, parts)
            if first != parts:
                raise TaskInvalid(f"lm-eval task {task!r}: {Collision(name, first, parts).describe()}")
            stderr = _number(reported.get(stderr_key(metric, filter_name)))
            values.append(
                MetricValue(
                    name=name,
                    value=value,
                    n=n,
                    stderr=stderr if stderr is not None and math.isfinite(stderr) else None,
                )
            )
    return tuple(values)


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _sample(
    entry: Mapping[str, Any], prompt_id: str, index: int, cut: int, count_tokens: Callable[[str], int]
) -> SampleOutput:
    arguments: Sequence[Sequence[Any]] = entry.get("arguments") or [[""]]
    resps: Sequence[Sequence[Any]] = entry.get("resps") or [[None]]
    filtered: Sequence[Any] = entry.get("filtered_resps") or [None]
    target = entry.get("target")
    first = resps[0][0] if resps and resps[0] else None
    prompt = _text(arguments[0][0]) if arguments and arguments[0] else ""
    extracted: str | None
    tokens = 0
    graded = True
    if isinstance(first, str):
        # generate_until: the model's text, and what the task's filter made of it.
        response = first
        extracted = _text(filtered[0]) if filtered else None
        tokens = count_tokens(response)
    elif isinstance(first, (tuple, list)) and len(arguments) == len(resps):
        # loglikelihood (multiple choice): the continuation the model found most likely.
        scores = [float(r[0][0]) for r in resps]
        best = max(range(len(scores)), key=scores.__getitem__)
        response = _text(arguments[best][1]).strip()
        extracted = response
        if isinstance(target, int) and 0 <= target < len(arguments):
            target = _text(arguments[target][1]).strip()
    else:
        # loglikelihood_rolling: no answer, only the text's log-likelihood.
        total = _number(first)
        response = "" if total is None else f"log-likelihood {total:.6g} nats"
        extracted = None
        # A perplexity sample is neither right nor wrong: not graded (never listed by --wrong-only).
        graded = False
    metrics: Sequence[str] = entry.get("metrics") or ()
    score = _number(entry.get(metrics[0])) if metrics else None
    return SampleOutput(
        index=index,
        prompt_id=prompt_id,
        prompt=cut_text(prompt, cut),
        response=cut_text(response, cut),
        extracted=None if extracted is None else cut_text(extracted, cut),
        reference=cut_text(_text(target), cut),
        correct=score == 1.0 if graded else None,
        tokens=tokens,
        truncated=False,
    )


def in_document_order(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One process logs a task's samples filter by filter, each in document order; data-parallel replicas'
    logs arrive one replica after another (each holding every ``world_size``-th document). Both in the
    one-process order: by filter (as first logged), then by document."""
    first_seen: dict[object, int] = {}
    for entry in entries:
        first_seen.setdefault(entry.get("filter", NO_FILTER), len(first_seen))

    def key(entry: Mapping[str, Any]) -> tuple[int, int]:
        doc_id = entry.get("doc_id")
        return first_seen[entry.get("filter", NO_FILTER)], doc_id if isinstance(doc_id, int) else 0

    return sorted(entries, key=key)


def sample_outputs(
    samples: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    prefixed: bool,
    max_samples: int,
    max_text_chars: int,
    count_tokens: Callable[[str], int],
) -> tuple[SampleOutput, ...]:
    """The first ``max_samples`` logged samples as evald samples. ``correct`` is the task's first metric
    being 1 for the document (exact match, accuracy); a perplexity task's samples are not graded
    (``None``: a score, no right answer). ``prompt_id`` is the document's id, after its task
    (``arith/12``) when the job ran several, and with its filter (``12:strict-match``) when the task has
    several."""
    outputs: list[SampleOutput] = []
    for task, entries in samples.items():
        filters = {entry.get("filter", NO_FILTER) for entry in entries}
        for entry in in_document_order(entries):
            if len(outputs) >= max_samples:
                return tuple(outputs)
            prompt_id = str(entry.get("doc_id", len(outputs)))
            if len(filters) > 1:
                prompt_id = f"{prompt_id}:{entry.get('filter', NO_FILTER)}"
            if prefixed:
                prompt_id = f"{task}/{prompt_id}"
            outputs.append(_sample(entry, prompt_id[:200], len(outputs), max_text_chars, count_tokens))
    return tuple(outputs)
