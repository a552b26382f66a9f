"""A job with several completions per prompt: pass@k, maj@k and the GRPO group statistics, recomputed from
the samples it returns."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from inference.metrics.passk import majority_at_k, pass_at_k
from inference.spec import InferenceSpec, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE
from inference.worker import run
from tests.conftest import ToyRun

METRICS = ("accuracy", "pass@1", "pass@4", "maj@4", "reward", "group_reward_std", "group_zero_spread", "bleu")


def test_sampled_metrics_agree_with_the_samples(toy_run: ToyRun, toy_dataset: Path, tmp_path: Path) -> None:
    spec = JobSpec(
        job_id=8,
        checkpoint_path=toy_run.last_checkpoint,
        result_path=tmp_path / "result.json",
        task=TaskSpec(
            name="sampled",
            dataset=toy_dataset,
            id_field="id",
            prompt_template=PROMPT_TEMPLATE,
            max_new_tokens=12,
            n_samples=4,
            temperature=1.0,
            batch_size=8,
            metrics=METRICS,
        ),
        inference=InferenceSpec(threads=1),
    )

    result, code = run(spec, 0)

    assert code == 0 and result is not None and result.error is None
    metrics = {m.name: m for m in result.metrics}
    assert len(result.samples) == 80
    by_prompt: dict[str, list[tuple[bool, str | None, float | None]]] = defaultdict(list)
    assert all(sample.correct is not None for sample in result.samples)  # generated answers are graded
    for sample in result.samples:
        by_prompt[sample.prompt_id].append((bool(sample.correct), sample.extracted, sample.reward))
    assert all(len(completions) == 4 for completions in by_prompt.values())
    correct = [[c for c, _, _ in completions] for completions in by_prompt.values()]
    rewards = [[r or 0.0 for _, _, r in completions] for completions in by_prompt.values()]

    assert metrics["pass@1"].value == pytest.approx(metrics["accuracy"].value)
    assert metrics["pass@4"].value == pytest.approx(statistics.mean(pass_at_k(4, sum(c), 4) for c in correct))
    assert metrics["pass@4"].n == 20
    majority = [majority_at_k([e for _, e, _ in cs], [c for c, _, _ in cs], 4) for cs in by_prompt.values()]
    assert metrics["maj@4"].value == pytest.approx(statistics.mean(majority))
    # The built-in reward is the grade.
    assert all(r == float(c) for cs in by_prompt.values() for c, _, r in cs)
    assert metrics["reward"].value == pytest.approx(metrics["accuracy"].value)
    assert metrics["group_reward_std"].value == pytest.approx(
        statistics.mean(statistics.stdev(r) for r in rewards)
    )
    assert metrics["group_zero_spread"].value == pytest.approx(
        statistics.mean(len(set(r)) == 1 for r in rewards)
    )
    assert metrics["group_zero_spread"].n == 20
    assert 0.0 <= metrics["bleu"].value <= 100.0 and metrics["bleu"].n == 80
