"""Generation's pure steps on real token ids: where a response ends, what counts, seeds per batch."""

from __future__ import annotations

import pytest

from inference.generation import Decoding, batch_seed, finish
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

    assert (ended.text, ended.tokens, ended.truncated) == ("15", 2, False)
    # No EOS and every new token used: truncated.
    assert (cut_short.text, cut_short.tokens, cut_short.truncated) == ("\\boxed{15}", 10, True)


def test_a_stop_string_ends_the_response_and_is_cut_off(ids: dict[str, list[int]]) -> None:
    tokenizer = build_tokenizer()
    row = ids["7 END x"]

    (stopped,) = finish([row], tokenizer, [EOS], Decoding(max_new_tokens=len(row), stop=(" END", "x")))
    (unstopped,) = finish([row], tokenizer, [EOS], Decoding(max_new_tokens=len(row), stop=("STOP",)))

    # The earliest stop string wins; the tokens generated up to the end still count.
    assert (stopped.text, stopped.tokens, stopped.truncated) == ("7", len(row), False)
    assert (unstopped.text, unstopped.truncated) == ("7 END x", True)


def test_each_batch_has_its_own_seed_whatever_ran_before() -> None:
    assert batch_seed(0, [3, 1, 2]) == batch_seed(0, [3, 1, 2])
    assert len({batch_seed(0, [1, 2]), batch_seed(1, [1, 2]), batch_seed(0, [1, 3])}) == 3
    assert 0 <= batch_seed(2**40, [10**9]) < 2**63
