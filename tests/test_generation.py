"""Generation's pure steps on real token ids: where a response ends, what counts, seeds per sample."""

from __future__ import annotations

import pytest

from inference.engines.draws import sample_seed, uniforms
from inference.generation import Decoding, finish
from inference.toy.tokenizer import build_tokenizer

EOS, PAD = 2, 0


@pytest.fixture(scope="module")
def ids() -> dict[str, list[int]]:
    tokenizer = build_tokenizer()
    return {
        text: tokenizer(text, add_special_tokens=False)["input_ids"]
        for text in ("15", "\\boxed{15}", "7 END x")
    }


def test_a_row_ends_at_eos_and_the_padding_after_it(ids: dict[str, list[int]]) -> None:
    tokenizer = build_tokenizer()
    rows = [ids["15"] + [EOS, PAD, PAD], ids["\\boxed{15}"]]

    ended, cut_short = finish(rows, tokenizer, [EOS], Decoding(max_new_tokens=len(ids["\\boxed{15}"])))

    assert (ended.text, ended.tokens, ended.truncated, ended.end) == ("15", 2, False, "eos")
    # No EOS and every new token used: truncated.
    assert (cut_short.text, cut_short.tokens, cut_short.truncated, cut_short.end) == (
        "\\boxed{15}",
        10,
        True,
        "length",
    )


def test_a_stop_string_ends_the_response_and_is_cut_off(ids: dict[str, list[int]]) -> None:
    tokenizer = build_tokenizer()
    row = ids["7 END x"]

    (stopped,) = finish([row], tokenizer, [EOS], Decoding(max_new_tokens=len(row), stop=(" END", "x")))
    (unstopped,) = finish([row], tokenizer, [EOS], Decoding(max_new_tokens=len(row), stop=("STOP",)))

    # The earliest stop string wins; the tokens generated up to the end still count.
    assert (stopped.text, stopped.tokens, stopped.truncated, stopped.end) == ("7", len(row), False, "stop")
    assert (unstopped.text, unstopped.truncated) == ("7 END x", True)


def test_each_sample_has_its_own_seed_whatever_runs_beside_it() -> None:
    assert sample_seed(0, 3, 1) == sample_seed(0, 3, 1)
    assert len({sample_seed(0, 1, 0), sample_seed(1, 1, 0), sample_seed(0, 2, 0), sample_seed(0, 1, 1)}) == 4
    assert 0 <= sample_seed(2**40, 10**9, 7) < 2**63


def test_a_rows_uniform_numbers_depend_on_its_seed_and_step_only() -> None:
    import torch

    seeds = torch.tensor([5, 5, 2**62 + 9, 5], dtype=torch.int64)
    steps = torch.tensor([0, 1, 0, 0], dtype=torch.int64)

    u = uniforms(seeds, steps).tolist()

    assert u[0] == u[3] != u[1]
    assert len({u[0], u[1], u[2]}) == 3
    assert all(0 < x < 1 for x in u)
    # Spread over (0, 1): the mean of many is near 1/2 and none repeats.
    many = uniforms(torch.arange(10_000, dtype=torch.int64), torch.zeros(10_000, dtype=torch.int64))
    assert abs(float(many.mean()) - 0.5) < 0.01
    assert len(set(many.tolist())) == 10_000
