"""Likelihood of held-out text: negative log-likelihood per token and perplexity.

Both are token-weighted over the whole set (what ``exp(loss)`` of one big batch gives), with the standard
error of the ratio over documents, the independent draws.

``word_perplexity``, ``byte_perplexity`` and ``bits_per_byte`` divide the same summed NLL by the words
(``len(re.split(r"\\s+", text))``) and UTF-8 bytes of the texts instead of their tokens: lm-evaluation-
harness's definitions for ``loglikelihood_rolling`` tasks, which do not depend on the tokenizer. They equal
lm-eval's numbers when both score the same tokens (see the README's lm-eval section).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

from inference.metrics.base import (
    LIKELIHOOD,
    DocumentRecord,
    EvalRecord,
    Metric,
    no_value,
    ratio_with_stderr,
)
from inference.spec import MetricValue, TaskKind


def _nll(record: EvalRecord) -> MetricValue:
    documents = [d for d in record.documents if d.tokens > 0]
    return ratio_with_stderr("nll", [d.nll for d in documents], [float(d.tokens) for d in documents])


class Nll(Metric):
    name = "nll"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "mean negative log-likelihood per token (nats) of the held-out text"
    kinds: ClassVar[frozenset[TaskKind]] = LIKELIHOOD

    def compute(self, record: EvalRecord) -> MetricValue:
        return _nll(record)


class Perplexity(Metric):
    name = "perplexity"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "exp of the mean negative log-likelihood per token of the held-out text"
    kinds: ClassVar[frozenset[TaskKind]] = LIKELIHOOD

    def compute(self, record: EvalRecord) -> MetricValue:
        nll = _nll(record)
        if nll.n == 0:
            return no_value(self.name)
        value = math.exp(nll.value)
        # Delta method: d exp(x) = exp(x) dx.
        stderr = None if nll.stderr is None else value * nll.stderr
        return MetricValue(name=self.name, value=value, n=nll.n, stderr=stderr)


def _per_unit(name: str, record: EvalRecord, unit: Callable[[DocumentRecord], int]) -> MetricValue:
    documents = [d for d in record.documents if unit(d) > 0]
    return ratio_with_stderr(name, [d.nll for d in documents], [float(unit(d)) for d in documents])


def _exp(name: str, nll: MetricValue) -> MetricValue:
    if nll.n == 0:
        return no_value(name)
    value = math.exp(nll.value)
    return MetricValue(
        name=name, value=value, n=nll.n, stderr=None if nll.stderr is None else value * nll.stderr
    )


class WordPerplexity(Metric):
    name = "word_perplexity"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "exp of the summed negative log-likelihood per whitespace-separated word"
    kinds: ClassVar[frozenset[TaskKind]] = LIKELIHOOD

    def compute(self, record: EvalRecord) -> MetricValue:
        return _exp(self.name, _per_unit(self.name, record, lambda d: d.words))


class BytePerplexity(Metric):
    name = "byte_perplexity"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "exp of the summed negative log-likelihood per UTF-8 byte of the text"
    kinds: ClassVar[frozenset[TaskKind]] = LIKELIHOOD

    def compute(self, record: EvalRecord) -> MetricValue:
        return _exp(self.name, _per_unit(self.name, record, lambda d: d.bytes))


class BitsPerByte(Metric):
    name = "bits_per_byte"
    higher_is_better: ClassVar[bool | None] = False
    description: ClassVar[str] = "summed negative log-likelihood in bits per UTF-8 byte of the text"
    kinds: ClassVar[frozenset[TaskKind]] = LIKELIHOOD

    def compute(self, record: EvalRecord) -> MetricValue:
        nats = _per_unit(self.name, record, lambda d: d.bytes)
        if nats.n == 0:
            return no_value(self.name)
        stderr = None if nats.stderr is None else nats.stderr / math.log(2)
        return MetricValue(name=self.name, value=nats.value / math.log(2), n=nats.n, stderr=stderr)
