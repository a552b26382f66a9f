from __future__ import annotations

import threading

import pytest

from inference.grading import Grade, grade


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        ("\\boxed{68}", "68", Grade("68", True)),
        ("23+45=\\boxed{68}", "68", Grade("68", True)),
        ("The answer is $\\boxed{67}$.", "68", Grade("67", False)),
        ("\\boxed{0.5}", "\\frac{1}{2}", Grade("\\frac{1}{2}", True)),
        ("\\boxed{\\frac{2}{4}}", "$\\frac{1}{2}$", Grade("\\frac{2}{4}", True)),
        ("so 19", "19", Grade("19", True)),
    ],
)
def test_grades_answers(response: str, reference: str, expected: Grade) -> None:
    assert grade(response, reference) == expected


@pytest.mark.parametrize(
    "response",
    ["", "garbage", "\\boxed{", "\\boxed{68", "}}}{{{\\\\", "\\frac{1}{0}" * 50, "9" * 5000, "\x00\n\t"],
)
def test_garbage_is_wrong_not_an_error(response: str) -> None:
    result = grade(response, "68")

    assert result.correct is False


def test_grades_outside_the_main_thread() -> None:
    # math-verify's timeouts use signal.alarm, which raises outside the main thread unless switched off.
    results: list[Grade] = []
    thread = threading.Thread(target=lambda: results.append(grade("\\boxed{104}", "104")))
    thread.start()
    thread.join()

    assert results == [Grade("104", True)]
