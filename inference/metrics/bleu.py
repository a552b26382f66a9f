"""Corpus BLEU of the responses against the references, by sacrebleu (its default 13a tokenisation)."""

from __future__ import annotations

from typing import ClassVar

from inference.metrics.base import EvalRecord, Metric, no_value
from inference.spec import MetricValue


class Bleu(Metric):
    """A corpus statistic, not a mean of per-sample scores: no standard error (a bootstrap would be one,
    at many times the cost)."""

    name = "bleu"
    higher_is_better: ClassVar[bool | None] = True
    description: ClassVar[str] = "corpus BLEU (0–100) of the responses against the references (sacrebleu)"

    def compute(self, record: EvalRecord) -> MetricValue:
        if not record.samples:
            return no_value(self.name)
        import sacrebleu

        hypotheses = [sample.response for sample in record.samples]
        references = [sample.reference for sample in record.samples]
        score = sacrebleu.corpus_bleu(hypotheses, [references]).score
        return MetricValue(name=self.name, value=float(score), n=len(hypotheses))
