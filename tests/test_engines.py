"""The engine contract, run over every engine in ``inference.engines.ENGINES``: an engine added there
passes these tests or is not an engine.

Greedy answers are checked against an oracle that shares no code with any engine (one prompt at a time,
the whole sequence through the model at every step, no cache), on the trained toy model and on the
4-layer random Llama of the benchmarks; sampled answers against the same item run alone; ends (EOS,
stop strings, budgets), truncation, token counts and entropy against their definitions.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.generation_throughput import build, make_prompts
from inference.engines import ENGINES, Request, build_engine, resolve, tp_limit
from inference.entropy import token_entropy
from inference.generation import Decoding, Generation, stop_token_ids
from inference.loader import load_model
from inference.spec import InferenceSpec
from inference.toy.problems import held_out_problems
from tests.conftest import ToyRun

NAMES = sorted(ENGINES)


@cache
def bench_model() -> tuple[Any, Any]:
    torch.set_num_threads(1)
    return build(0)


@pytest.fixture(scope="module")
def toy(toy_run: ToyRun) -> tuple[Any, Any]:
    loaded = load_model(toy_run.last_checkpoint, InferenceSpec(engine="hf", threads=1))
    return loaded.model, loaded.tokenizer


def requests(
    tokenizer: Any, prompts: Sequence[str], budgets: Sequence[int | None] | None = None
) -> list[Request]:
    ids = tokenizer(list(prompts))["input_ids"]
    return [
        Request(
            index=i,
            prompt_ids=tuple(ids[i]),
            key=100 + i,
            max_new_tokens=None if budgets is None else budgets[i],
        )
        for i in range(len(prompts))
    ]


def run(
    name: str, model: Any, tokenizer: Any, work: Sequence[Request], decoding: Decoding, batch: int = 4
) -> Any:
    return build_engine(name, model, tokenizer, batch_size=batch).run(work, decoding).generations


def oracle(model: Any, tokenizer: Any, prompt_ids: Sequence[int], budget: int) -> list[int]:
    """Greedy tokens of one prompt, the whole sequence through the model at every step, ended at an end
    token or the budget."""
    ends = frozenset({*stop_token_ids(model, tokenizer), tokenizer.pad_token_id})
    return list(_oracle(model, ends, tuple(prompt_ids), budget))


@cache
def _oracle(model: Any, ends: frozenset[int], prompt_ids: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """:func:`oracle`, once per model and prompt: every engine's test asks it the same (the cache holds
    the model, so its identity cannot pass to another)."""
    ids = list(prompt_ids)
    out: list[int] = []
    with torch.inference_mode():
        while len(out) < budget:
            token = int(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token in ends:
                break
    return tuple(out)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_answers_are_the_oracles_on_the_toy_model(name: str, toy: tuple[Any, Any]) -> None:
    model, tokenizer = toy
    prompts = [f"{p.text}=" for p in held_out_problems(6, seed=5)]
    work = requests(tokenizer, prompts)

    got = run(name, model, tokenizer, work, Decoding(max_new_tokens=16), batch=4)

    eos = stop_token_ids(model, tokenizer)
    for request in work:
        (generation,) = got[request.index]
        expected = oracle(model, tokenizer, request.prompt_ids, 16)
        ended = expected[-1] in eos
        assert generation.tokens == len(expected) - (1 if ended else 0)
        text = tokenizer.decode(expected, skip_special_tokens=True)
        assert generation.text == text
        assert generation.end == ("eos" if ended else "length")
        assert generation.truncated is (not ended)
    # The trained toy model answers and says EOS: the end path is exercised, not only the budget.
    assert any(g.end == "eos" for gens in got.values() for g in gens)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_answers_are_the_oracles_on_the_benchmark_model_with_budgets_of_their_own(name: str) -> None:
    model, tokenizer = bench_model()
    prompts = make_prompts(7, seed=3)
    budgets: list[int | None] = [3, None, 9, 1, 12, None, 5]
    work = requests(tokenizer, prompts, budgets)

    got = run(name, model, tokenizer, work, Decoding(max_new_tokens=10), batch=3)

    for request in work:
        (generation,) = got[request.index]
        budget = request.budget(Decoding(max_new_tokens=10))
        expected = oracle(model, tokenizer, request.prompt_ids, budget)
        assert generation.text == tokenizer.decode(expected, skip_special_tokens=True)
        assert (generation.tokens, generation.truncated, generation.end) == (budget, True, "length")


@pytest.mark.parametrize("name", NAMES)
def test_a_stop_string_ends_the_row_where_the_text_holds_it(name: str) -> None:
    model, tokenizer = bench_model()
    prompts = make_prompts(6, seed=4)
    reference = run("fixed", model, tokenizer, requests(tokenizer, prompts), Decoding(max_new_tokens=24))
    # Stop strings taken from what the model says: a character of one row's answer, and a pair of another.
    texts = [reference[i][0].text for i in range(len(prompts))]
    longest = sorted(texts, key=len, reverse=True)
    stop = (longest[0][len(longest[0]) // 2], longest[1][3:5])
    decoding = Decoding(max_new_tokens=24, stop=stop)

    got = run(name, model, tokenizer, requests(tokenizer, prompts), decoding)

    for i, text in enumerate(texts):
        (generation,) = got[i]
        hits = [text.find(s) for s in stop if s in text]
        if hits:
            assert generation.text == text[: min(hits)]
            assert (generation.end, generation.truncated) == ("stop", False)
            if reference[i][0].tokens == len(text):
                # One token per character here: the row ended where the first stop string was complete,
                # and its tokens count up to there, the stop string included.
                assert generation.tokens == min(text.find(s) + len(s) for s in stop if s in text)
        else:
            assert generation == reference[i][0]
    assert sum(g.end == "stop" for gens in got.values() for g in gens) >= 2


@pytest.mark.parametrize("name", NAMES)
def test_a_sample_depends_on_its_item_and_index_not_on_its_batch(name: str, toy: tuple[Any, Any]) -> None:
    model, tokenizer = toy
    prompts = [f"{p.text}=" for p in held_out_problems(5, seed=7)]
    work = requests(tokenizer, prompts)
    decoding = Decoding(max_new_tokens=10, temperature=1.3, top_p=0.95, n_samples=3, seed=11)

    together = run(name, model, tokenizer, work, decoding, batch=4)
    alone = run(name, model, tokenizer, [work[3]], decoding, batch=1)
    reordered = run(name, model, tokenizer, [work[4], work[3], work[0]], decoding, batch=2)

    assert alone[3] == together[3] == reordered[3]
    assert reordered[0] == together[0]
    # The samples of one item differ from each other, and another seed draws others.
    assert len({g.text for g in together[3]}) > 1
    reseeded = run(name, model, tokenizer, [work[3]], dataclasses.replace(decoding, seed=12), batch=1)
    assert reseeded[3] != together[3]


@pytest.mark.parametrize("name", NAMES)
def test_every_engine_draws_the_same_samples(name: str, toy: tuple[Any, Any]) -> None:
    model, tokenizer = toy
    prompts = [f"{p.text}=" for p in held_out_problems(6, seed=8)]
    decoding = Decoding(max_new_tokens=12, temperature=0.9, n_samples=2, seed=4, entropy=True)

    expected = run("fixed", model, tokenizer, requests(tokenizer, prompts), decoding, batch=3)
    got = run(name, model, tokenizer, requests(tokenizer, prompts), decoding, batch=4)

    for index, generations in expected.items():
        assert [_plain(g) for g in got[index]] == [_plain(g) for g in generations]
        for mine, theirs in zip(got[index], generations, strict=True):
            assert mine.entropy_sum == pytest.approx(theirs.entropy_sum, abs=1e-4)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_entropy_is_the_policys_at_each_step_that_drew_the_response(
    name: str, temperature: float, toy: tuple[Any, Any]
) -> None:
    model, tokenizer = toy
    prompts = [f"{p.text}=" for p in held_out_problems(4, seed=2)]
    work = requests(tokenizer, prompts)
    decoding = Decoding(max_new_tokens=12, temperature=temperature, entropy=True, seed=3)

    got = run(name, model, tokenizer, work, decoding)

    for request in work:
        (generation,) = got[request.index]
        response = tokenizer(generation.text, add_special_tokens=False)["input_ids"]
        steps = len(response) + (0 if generation.truncated else 1)
        ids = torch.tensor([list(request.prompt_ids) + response])
        start = len(request.prompt_ids) - 1
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, start : start + steps]
        direct = token_entropy(logits, temperature if temperature > 0 else 1.0).sum().item()
        assert generation.entropy_tokens == steps
        assert generation.entropy_sum == pytest.approx(direct, abs=1e-4)
    plain = run(name, model, tokenizer, work, Decoding(max_new_tokens=12, temperature=temperature, seed=3))
    assert all((g.entropy_sum, g.entropy_tokens) == (0.0, 0) for gens in plain.values() for g in gens)


@pytest.mark.parametrize("name", NAMES)
def test_a_load_too_large_for_the_device_is_torchs_out_of_memory_error(name: str) -> None:
    model, tokenizer = bench_model()
    work = requests(tokenizer, make_prompts(6, seed=1))

    with pytest.raises(torch.OutOfMemoryError):
        run(name, model, tokenizer, work, Decoding(max_new_tokens=2, simulate_oom_above=3), batch=4)
    # Half the load fits: the worker's retry at half the batch size goes through.
    assert (
        len(run(name, model, tokenizer, work, Decoding(max_new_tokens=2, simulate_oom_above=3), batch=2)) == 6
    )


@pytest.mark.parametrize("name", NAMES)
def test_no_requests_is_no_work(name: str) -> None:
    model, tokenizer = bench_model()

    assert run(name, model, tokenizer, [], Decoding(max_new_tokens=4)) == {}


STOPS = st.lists(st.text(alphabet="0123456789+-*=abc", min_size=1, max_size=3), max_size=2)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=7),
    budgets=st.lists(st.one_of(st.none(), st.integers(min_value=1, max_value=14)), min_size=7, max_size=7),
    max_new=st.integers(min_value=1, max_value=14),
    stop=STOPS,
    batch=st.integers(min_value=1, max_value=5),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_greedy_outputs_are_equal_across_engines_whatever_the_lengths_and_stops(
    lengths: list[int], budgets: list[int | None], max_new: int, stop: list[str], batch: int, seed: int
) -> None:
    model, tokenizer = bench_model()
    alphabet = "0123456789+-*="
    prompts = [
        "".join(alphabet[(seed + i * 7 + j * 3) % len(alphabet)] for j in range(n))
        for i, n in enumerate(lengths)
    ]
    work = requests(tokenizer, prompts, budgets[: len(prompts)])
    decoding = Decoding(max_new_tokens=max_new, stop=tuple(stop))

    answers = {name: run(name, model, tokenizer, work, decoding, batch=batch) for name in NAMES}

    reference = answers["fixed"]
    for name, got in answers.items():
        assert got == reference, name


def test_auto_picks_the_measured_engine_per_device_and_fixed_batches_at_tp_above_1() -> None:
    assert resolve("auto", device="cpu", tp=1) == "continuous"
    assert resolve("auto", device="cuda:0", tp=2) == "fixed"
    assert resolve("fixed", device="cpu", tp=1) == "fixed"
    assert resolve("continuous", device="cpu", tp=1) == "continuous"
    assert tp_limit("continuous", 1) is None and tp_limit("auto", 4) is None
    assert "tp = 1 only" in (tp_limit("continuous", 2) or "")


def test_the_config_refuses_continuous_batching_at_tp_above_1() -> None:
    from pydantic import ValidationError

    from daemon.config.inference import InferenceConfig

    with pytest.raises(ValidationError, match='batching = "continuous" runs at tp = 1 only'):
        InferenceConfig(batching="continuous", tp=2)
    assert InferenceConfig(batching="continuous").spec().batching == "continuous"
    with pytest.raises(ValidationError, match='batching = "paged" runs at tp = 1 only'):
        InferenceConfig(batching="paged", tp=2)
    assert InferenceConfig(batching="paged").spec().batching == "paged"
    assert InferenceConfig(tp=2).spec().batching == "auto"
    with pytest.raises(ValidationError, match="batching"):
        InferenceConfig(batching="dynamic")


def _plain(generation: Generation) -> tuple[str, int, bool, str, int]:
    return generation.text, generation.tokens, generation.truncated, generation.end, generation.entropy_tokens


def test_a_draws_frequencies_follow_the_policy() -> None:
    from inference.engines.draws import choose

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    seeds = torch.arange(4000, dtype=torch.int64) * 7919 + 13

    drawn = choose(logits, 1.0, 1.0, seeds, torch.zeros(4000, dtype=torch.int64))
    nucleus = choose(logits, 1.0, 0.7, seeds, torch.zeros(4000, dtype=torch.int64))

    counts = torch.bincount(drawn, minlength=4).tolist()
    for count, p in zip(counts, [0.5, 0.3, 0.15, 0.05], strict=True):
        # Four standard deviations of a binomial count: fails by chance about once in 15,000 runs of
        # other seeds, and these seeds are fixed.
        assert abs(count - 4000 * p) < 4 * math.sqrt(4000 * p * (1 - p))
    # top_p = 0.7 keeps the two most likely tokens (0.5 + 0.3 reach it), in the ratio 5 : 3.
    kept = torch.bincount(nucleus, minlength=4).tolist()
    assert kept[2] == kept[3] == 0
    assert abs(kept[0] / 4000 - 0.625) < 0.04


def test_the_gpu_checks_engine_step_runs_end_to_end_at_cpu_size(tmp_path: Path) -> None:
    from bench.engine_gpu import main

    main(["--tiny", "--skip", "sweep", "--json", str(tmp_path / "engines.json")])

    figures = json.loads((tmp_path / "engines.json").read_text())
    compare = figures["compare"]
    assert compare["equal"] is True
    assert compare["fixed"]["tokens"] == compare["continuous"]["tokens"] == compare["paged"]["tokens"] > 0
    assert figures["hold"]["without_oom_retry"] is True
    assert figures["hold"]["sequences"] == figures["hold"]["batch"]
