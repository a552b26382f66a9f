"""pass@k and maj@k against hand-computed cases."""

from __future__ import annotations

import math

import pytest

from inference.metrics.passk import majority_at_k, pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # one draw: the share correct
        (5, 2, 2, 1 - math.comb(3, 2) / math.comb(5, 2)),  # 1 - 3/10 = 0.7
        (5, 2, 3, 1 - math.comb(3, 3) / math.comb(5, 3)),  # 1 - 1/10 = 0.9
        (5, 2, 4, 1.0),  # four draws cannot all miss with only three wrong
        (5, 2, 5, 1.0),
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (10, 3, 4, 1 - math.comb(7, 4) / math.comb(10, 4)),  # 1 - 35/210
        (1, 1, 1, 1.0),
    ],
)
def test_pass_at_k_is_the_closed_form(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_stays_finite_for_large_n() -> None:
    assert pass_at_k(1000, 10, 100) == pytest.approx(1 - math.comb(990, 100) / math.comb(1000, 100), rel=1e-9)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_majority_at_k_takes_the_most_frequent_answer_of_the_first_k() -> None:
    answers = ["4", "5", "4", "4", "5"]
    correct = [True, False, True, True, False]
    assert majority_at_k(answers, correct, 5) == 1.0
    assert majority_at_k(answers, correct, 2) == 0.5  # "4" and "5" tie: half the tied answers are right
    assert majority_at_k(["5", "5", "4"], [False, False, True], 3) == 0.0


def test_majority_at_k_ties_are_the_expected_random_break_whatever_the_order() -> None:
    three_way = (["1", "2", "3"], [False, True, False])
    assert majority_at_k(*three_way, 3) == pytest.approx(1 / 3)
    assert majority_at_k(["3", "1", "2"], [False, False, True], 3) == pytest.approx(1 / 3)
    assert majority_at_k(["7", "7", "8", "8"], [True, True, True, True], 4) == 1.0


def test_majority_at_k_ignores_samples_without_an_answer() -> None:
    assert majority_at_k([None, None, "4"], [False, False, True], 3) == 1.0
    assert majority_at_k([None, None], [False, False], 2) == 0.0
    with pytest.raises(ValueError, match="maj@k needs 1 <= k <= n"):
        majority_at_k(["4"], [True], 2)
    with pytest.raises(ValueError, match="1 answers but 2 grades"):
        majority_at_k(["4"], [True, False], 1)
