"""Likelihood of held-out text: negative log-likelihood per token and perplexity.

Both are token-weighted over the whole set (what ``exp(loss)`` of one big batch gives), with the standard
error of the ratio over documents, the independent draws.
"""

from __future__ import annotations

import math
from typing import ClassVar

from inference.metrics.base import LIKELIHOOD, EvalRecord, Metric, ratio_with_stderr
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
            return MetricValue(name=self.name, value=0.0, n=0)
        value = math.exp(nll.value)
        # Delta method: d exp(x) = exp(x) dx.
        stderr = None if nll.stderr is None else value * nll.stderr
        return MetricValue(name=self.name, value=value, n=nll.n, stderr=stderr)
