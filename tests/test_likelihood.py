"""Likelihood tasks: perplexity checked against the model's own loss, and a job end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from inference.generation import prepare_batches
from inference.likelihood import score_batches, token_nll
from inference.loader import load_model
from inference.spec import InferenceSpec, JobResult, JobSpec, MetricValue, Problem, TaskSpec
from inference.toy.problems import DATA_DIR
from inference.toy.tokenizer import ALPHABET
from inference.worker import run
from tests.conftest import ToyRun

TEXTS = ["13+91=\\boxed{104}", "5+6=\\boxed{11}", "58+56=\\boxed{114} and a longer tail to pad the others"]


def test_token_nll_scores_each_token_given_the_real_tokens_before_it() -> None:
    # Vocabulary of 3; row 1 is left-padded by one position.
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]] * 3, [[0.1, 0.1, 0.8]] * 3]))
    ids = torch.tensor([[0, 1, 2], [0, 2, 2]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])

    nll = token_nll(logits, ids, mask)

    expected = torch.tensor([[-math.log(0.25), -math.log(0.25)], [0.0, -math.log(0.8)]])
    assert torch.allclose(nll, expected)


def test_perplexity_is_exp_of_the_models_own_mean_loss(toy_run: ToyRun) -> None:
    loaded = load_model(toy_run.last_checkpoint, InferenceSpec(engine="hf", threads=1))
    tokenizer, model = loaded.tokenizer, loaded.model

    # Two batches, one of them left-padded: positions must not shift with the padding.
    scored, latencies = score_batches(model, prepare_batches(tokenizer, TEXTS, batch_size=2))
    total_nll = sum(document.nll for document in scored.values())
    total_tokens = sum(document.tokens for document in scored.values())

    losses, counts = [], []
    with torch.inference_mode():
        for text in TEXTS:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            losses.append(float(model(input_ids=ids, labels=ids).loss))
            counts.append(ids.shape[1] - 1)
    mean_loss = sum(loss * count for loss, count in zip(losses, counts, strict=True)) / sum(counts)

    assert len(latencies) == 2
    assert [scored[i].tokens for i in range(3)] == counts
    for i, (loss, count) in enumerate(zip(losses, counts, strict=True)):
        assert scored[i].nll / count == pytest.approx(loss, abs=1e-4)
    assert math.exp(total_nll / total_tokens) == pytest.approx(math.exp(mean_loss), abs=1e-4)


def test_a_likelihood_job_reports_perplexity_and_its_bad_rows(toy_run: ToyRun, tmp_path: Path) -> None:
    dataset = tmp_path / "text.jsonl"
    lines = (DATA_DIR / "arith-text.jsonl").read_text(encoding="utf-8").splitlines()[:30]
    lines[4] = json.dumps({"id": "bad", "body": "no text field"})
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = JobSpec(
        job_id=4,
        checkpoint_path=toy_run.last_checkpoint,
        result_path=tmp_path / "result.json",
        task=TaskSpec(
            name="heldout-text",
            kind="likelihood",
            dataset=dataset,
            id_field="id",
            batch_size=8,
            metrics=("perplexity", "nll", "tokens_per_s", "latency_p95_s", "peak_memory_mb"),
        ),
        inference=InferenceSpec(threads=1),
    )

    result, code = run(spec, 0)

    assert code == 0 and result is not None and result.error is None
    metrics = {m.name: m for m in result.metrics}
    assert metrics["nll"].n == 29
    assert metrics["perplexity"].value == pytest.approx(math.exp(metrics["nll"].value))
    # Even briefly trained, the model does far better than uniform over its alphabet.
    assert 1.0 < metrics["perplexity"].value < len(ALPHABET) / 2
    assert metrics["perplexity"].stderr is not None and metrics["perplexity"].stderr > 0
    assert metrics["tokens_per_s"].value > 0
    assert metrics["latency_p95_s"].n == 4
    assert metrics["peak_memory_mb"].value > 50
    assert result.samples == ()
    assert result.problems == (Problem(where=f"{dataset}:5", message="missing field 'text'"),)


def test_a_nan_perplexity_survives_the_result_file(tmp_path: Path) -> None:
    # A diverged checkpoint's logits are NaN: its metrics must reach the daemon, not an unreadable file.
    path = tmp_path / "result.json"
    JobResult(job_id=1, metrics=(MetricValue(name="perplexity", value=math.nan, n=3),)).write(path)

    (value,) = JobResult.read(path).metrics

    assert math.isnan(value.value) and value.n == 3
