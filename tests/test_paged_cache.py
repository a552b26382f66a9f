"""The paged engine's KV pool (inference/engines/pages.py): memory follows the live tokens, a pool the
live sequences outgrow preempts the newest and answers the same, and a pool too small for one sequence is
torch's out-of-memory error (the worker's retry at a smaller load follows). The engine contract itself
(tests/test_engines.py) runs over the paged engine like every other."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.generation_throughput import make_prompts
from inference.engines import build_engine
from inference.engines.base import Decoding, Request
from inference.engines.continuous import ContinuousEngine
from inference.engines.pages import BLOCK_SIZE
from tests.test_engines import bench_model


def long_tailed(tokenizer: Any, count: int, long: int) -> list[Request]:
    """``count`` prompts, each fifth with a budget of ``long`` tokens, the rest 2-5."""
    ids = tokenizer(make_prompts(count, seed=9))["input_ids"]
    return [
        Request(index=i, prompt_ids=tuple(ids[i]), key=i, max_new_tokens=long if i % 5 == 0 else 2 + i % 4)
        for i in range(count)
    ]


def engine(name: str, batch: int, kv_tokens: int | None = None) -> ContinuousEngine:
    model, tokenizer = bench_model()
    built = build_engine(name, model, tokenizer, batch_size=batch)
    assert isinstance(built, ContinuousEngine)
    built.kv_tokens = kv_tokens
    return built


def test_the_pool_holds_the_live_tokens_not_every_slot_at_full_length() -> None:
    _, tokenizer = bench_model()
    work = long_tailed(tokenizer, 20, 48)
    decoding = Decoding(max_new_tokens=48)
    slots, paged = engine("continuous", 8), engine("paged", 8)

    assert paged.run(work, decoding).generations == slots.run(work, decoding).generations

    # Whole-length slots hold 8 x (longest prompt + 48 + 1) tokens; the pool, at most what was live at
    # once, in whole blocks: here under half of it.
    assert paged.preemptions == 0
    assert paged.peak_tokens % BLOCK_SIZE == 0
    assert paged.peak_tokens < slots.peak_tokens / 2, (paged.peak_tokens, slots.peak_tokens)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_pool_the_live_sequences_outgrow_preempts_the_newest_and_answers_the_same(
    temperature: float,
) -> None:
    _, tokenizer = bench_model()
    work = long_tailed(tokenizer, 16, 40)
    decoding = Decoding(max_new_tokens=40, temperature=temperature, n_samples=2, seed=5, entropy=True)
    roomy = engine("paged", 6)
    # Room for about two long sequences at once, where six slots could each hold one.
    tight = engine("paged", 6, kv_tokens=7 * BLOCK_SIZE)

    expected, got = roomy.run(work, decoding).generations, tight.run(work, decoding).generations

    assert tight.preemptions > 0 and roomy.preemptions == 0
    assert tight.peak_tokens <= 7 * BLOCK_SIZE
    for index, generations in expected.items():
        for mine, theirs in zip(got[index], generations, strict=True):
            assert (mine.text, mine.tokens, mine.end, mine.entropy_tokens) == (
                theirs.text,
                theirs.tokens,
                theirs.end,
                theirs.entropy_tokens,
            )
            assert mine.entropy_sum == pytest.approx(theirs.entropy_sum, abs=1e-4)


def test_a_pool_too_small_for_one_sequence_is_torchs_out_of_memory_error() -> None:
    _, tokenizer = bench_model()
    work = long_tailed(tokenizer, 3, 40)

    with pytest.raises(torch.OutOfMemoryError, match="cannot hold one"):
        engine("paged", 2, kv_tokens=BLOCK_SIZE).run(work, Decoding(max_new_tokens=40))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    budgets=st.lists(st.integers(min_value=1, max_value=36), min_size=1, max_size=7),
    batch=st.integers(min_value=1, max_value=5),
    blocks=st.integers(min_value=3, max_value=16),
)
def test_any_pool_size_that_holds_one_sequence_gives_the_roomy_pools_answers(
    budgets: list[int], batch: int, blocks: int
) -> None:
    _, tokenizer = bench_model()
    ids = tokenizer(make_prompts(len(budgets), seed=len(budgets)))["input_ids"]
    work = [
        Request(index=i, prompt_ids=tuple(ids[i]), key=i, max_new_tokens=b) for i, b in enumerate(budgets)
    ]
    decoding = Decoding(max_new_tokens=36)

    expected = engine("paged", batch).run(work, decoding).generations
    # Every sequence fits alone: its prompt, its budget and one more token.
    fits = max(len(r.prompt_ids) + b + 1 for r, b in zip(work, budgets, strict=True))
    tokens = max(blocks * BLOCK_SIZE, -(-fits // BLOCK_SIZE) * BLOCK_SIZE)
    tight = engine("paged", batch, kv_tokens=tokens)

    assert tight.run(work, decoding).generations == expected
    assert tight.peak_tokens <= tokens


@pytest.mark.parametrize("name", ["continuous", "paged"])
def test_grouped_attention_answers_as_the_models_own_on_a_grouped_query_model(name: str) -> None:
    """On CUDA both engines attend with ``grouped_attention`` (each key-value head read once for its query
    heads); here on a model of 4 query heads over 2 key-value heads it must give the model's own answers."""
    from bench.engine_gpu import build_model

    model, tokenizer = build_model("tiny", "cpu", "float32", 256)
    work = long_tailed(tokenizer, 10, 30)
    decoding = Decoding(max_new_tokens=30, temperature=0.7, seed=2, entropy=True)
    answers = {}
    for grouped in (False, True):
        built = build_engine(name, model, tokenizer, batch_size=4)
        assert isinstance(built, ContinuousEngine)
        built.grouped = grouped
        answers[grouped] = built.run(work, decoding).generations

    for index, generations in answers[False].items():
        for mine, theirs in zip(answers[True][index], generations, strict=True):
            assert (mine.text, mine.tokens, mine.end) == (theirs.text, theirs.tokens, theirs.end)
            assert mine.entropy_sum == pytest.approx(theirs.entropy_sum, abs=1e-4)
