from __future__ import annotations

import threading

import pytest

from inference.grading import Grade, _reference, _shortcut, grade


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


# (model output, MATH500-style reference, what a careful human grader says). Near misses sit next to the
# equivalent forms they miss, so that a grader that calls everything right (or wrong) fails half the table.
PAIRS: list[tuple[str, str, bool]] = [
    # Fractions and decimals.
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
    (r"The final answer is 0.5", r"\frac{1}{2}", True),
    (r"The final answer is 0.25", r"\frac{1}{2}", False),
    (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", True),
    (r"so the fraction is $\boxed{\frac{6}{8}}$", r"\frac{3}{4}", True),
    (r"\boxed{3/4}", r"\frac34", True),
    (r"\boxed{\frac{3}{4}}", r"\frac{4}{3}", False),
    (r"\boxed{3.5}", r"3\frac{1}{2}", True),
    (r"\boxed{\frac{5}{2}}", r"3\frac{1}{2}", False),
    (r"\boxed{-\dfrac{1}{3}}", r"-\frac{1}{3}", True),
    (r"\boxed{\frac{-1}{3}}", r"-\frac{1}{3}", True),
    (r"\boxed{\frac{1}{3}}", r"-\frac{1}{3}", False),
    (r"\boxed{0.33}", r"\frac{1}{3}", False),
    # Roots.
    (r"... so the answer is $\boxed{2\sqrt{2}}$.", r"\sqrt{8}", True),
    (r"\boxed{2\sqrt{3}}", r"\sqrt{8}", False),
    (r"\boxed{4\sqrt{2}}", r"\sqrt{8}", False),
    (r"\boxed{\sqrt{117}}", r"3\sqrt{13}", True),
    (r"\boxed{\frac{1}{\sqrt{3}}}", r"\frac{\sqrt{3}}{3}", True),
    (r"\boxed{1.414}", r"\sqrt{2}", False),
    # Intervals: ends open or closed, swapped, and the same set written as an inequality.
    (r"The solution set is $\boxed{(-\infty, 3]}$.", r"(-\infty, 3]", True),
    (r"\boxed{(-\infty, 3)}", r"(-\infty, 3]", False),
    (r"\boxed{[3, -\infty)}", r"(-\infty, 3]", False),
    (r"\boxed{x < 3}", r"(-\infty, 3)", True),
    (r"\boxed{x \le 3}", r"(-\infty, 3)", False),
    (r"\boxed{(3, \infty)}", r"(-\infty, 3)", False),
    (r"\boxed{[2, 5]}", r"[2,5)", False),
    (r"\boxed{x \in [-2,7]}", r"[-2,7]", True),
    (r"\boxed{(-\infty, -2) \cup (2, \infty)}", r"(-\infty,-2)\cup(2,\infty)", True),
    (r"\boxed{(-\infty, 3) \cup (5, \infty)}", r"(-\infty, 3] \cup [5, \infty)", False),
    # Sets and lists of solutions: order does not matter, a missing or extra element does.
    (r"\boxed{\{3,2,1\}}", r"\{1, 2, 3\}", True),
    (r"\boxed{1,2,3}", r"\{1, 2, 3\}", True),
    (r"\boxed{\{1, 2\}}", r"\{1, 2, 3\}", False),
    (r"\boxed{\{1,2,3,4\}}", r"\{1, 2, 3\}", False),
    (r"The solutions are $\boxed{7, 5, 3}$.", r"3, 5, 7", True),
    (r"\boxed{3, 5}", r"3, 5, 7", False),
    (r"\boxed{\pm 1}", r"-1, 1", True),
    (r"\boxed{1}", r"\pm 1", False),
    # Ordered pairs: order matters.
    (r"\boxed{(3, \frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", True),
    (r"\boxed{(-1, 3)}", r"(3,-1)", False),
    # Multiple choice.
    (r"\boxed{C}", r"\text{(C)}", True),
    (r"The correct option is \boxed{\textbf{(C)}}", r"\text{(C)}", True),
    (r"\boxed{(D)}", r"\text{(C)}", False),
    # Percent, degrees, money, thousands separators.
    (r"\boxed{10\%}", r"10\%", True),
    (r"\boxed{10}", r"10\%", True),
    (r"\boxed{11\%}", r"10\%", False),
    (r"\boxed{5\%}", r"50\%", False),
    (r"\boxed{30^\circ}", r"30^\circ", True),
    (r"\boxed{60}", r"60^\circ", True),
    (r"\boxed{120^\circ}", r"60^\circ", False),
    (r"\boxed{\$18.90}", r"\$18.90", True),
    (r"\boxed{18.9}", r"\$18.90", True),
    (r"\boxed{\$19.80}", r"\$18.90", False),
    (r"\boxed{1000}", r"1,\!000", True),
    (r"\boxed{27,000}", r"27,\!000", True),
    (r"\boxed{100}", r"1,\!000", False),
    (r"\boxed{10,000}", r"1,\!000", False),
    # Integers: sign and off by one.
    (r"\[ x = \boxed{-3} \]", r"-3", True),
    (r"\boxed{3}", r"-3", False),
    (r"\boxed{-68}", r"68", False),
    (r"\boxed{69}", r"68", False),
    (r"\boxed{68.5}", r"68", False),
    (r"Therefore, the final answer is $\boxed{5}$. I hope it is correct.", r"5", True),
    (r"\boxed{x=5}", r"5", True),
    # Pi, polynomials, complex numbers.
    (r"\boxed{\pi/4}", r"\frac{\pi}{4}", True),
    (r"\boxed{\frac{3\pi}{2}}", r"\frac32\pi", True),
    (r"\boxed{\pi \cdot 100}", r"100\pi", True),
    (r"\boxed{\frac{\pi}{3}}", r"\frac{\pi}{4}", False),
    (r"\boxed{\pi}", r"2\pi", False),
    (r"\boxed{6.28}", r"2\pi", False),
    (r"\boxed{(x+1)^2}", r"x^2+2x+1", True),
    (r"\boxed{(x-1)^2}", r"x^2+2x+1", False),
    (r"\boxed{6-5i}", r"6 - 5i", True),
    (r"\boxed{6+5i}", r"6 - 5i", False),
    (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", True),
    # Matrices, including a reference written over several lines.
    (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", "\\begin{pmatrix}\n1 \\\\ 2\n\\end{pmatrix}", True),
    (r"\boxed{\begin{pmatrix} -1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix} 1 \\ -2 \end{pmatrix}", False),
    (
        r"\boxed{\begin{pmatrix} 0 & 2 \\ 2 & 0 \end{pmatrix}}",
        r"\begin{pmatrix} 2 & 0 \\ 0 & 2 \end{pmatrix}",
        False,
    ),
]


def test_the_table_is_balanced() -> None:
    right = sum(expected for _, _, expected in PAIRS)

    assert len(PAIRS) >= 45
    assert len({(response, reference) for response, reference, _ in PAIRS}) == len(PAIRS)
    assert 0.4 <= right / len(PAIRS) <= 0.6


@pytest.mark.parametrize(("response", "reference", "expected"), PAIRS)
def test_agrees_with_a_careful_grader(response: str, reference: str, expected: bool) -> None:
    assert grade(response, reference).correct is expected


GARBAGE = [
    "",
    "garbage",
    "\\boxed{",
    "\\boxed{68",
    "}}}{{{\\\\",
    "\\frac{1}{0}" * 50,
    "9" * 5000,
    "\x00\n\t",
]


@pytest.mark.parametrize("response", GARBAGE)
def test_garbage_is_wrong_not_an_error(response: str) -> None:
    result = grade(response, "68")

    assert result.correct is False


# Responses where the reference's text appears but is not, or not alone, the answer math-verify reports.
DECOYS = [
    "\\boxed{68}}",
    "\\boxed{6}8",
    "\\boxed{ 68 }",
    "$\\boxed{68}$",
    "$\\boxed{68}$%",
    "\\boxed{68\\%}",
    "\\boxed{68}.",
    "\\fbox{68}",
    "\\boxed{68} and \\boxed{68}",
    "\\boxed{67} and \\boxed{68}",
    "\\boxed{68} and \\boxed{67}",
    "\\boxed{68}, so not \\boxed{67}",
    "\\boxed{68} The final answer is $67$.",
    "The final answer is $68$. I hope it is correct. \\boxed{67}",
    "The final answer is 68",
    "The final answer is 67, not $68$.",
    "At first \\boxed{67}, but checking the sum digit by digit, carrying the one from the units column, "
    "it comes to \\boxed{68}",
    "answer: 68",
    "$68$ and $68$",
    "$68$ or $67$",
    "\\boxed{\\boxed{68}}",
    "\\boxed{\\text{68}}",
    "\\boxed{068}",
    "\\boxed{68.0}",
    "68",
    "\\(68\\)",
    "\\[68\\]",
    " [68] ",
    "$$68$$",
    "\\boxed{}",
    "\\boxed{\\frac{1}{2}}",
    "\\boxed{0.5}",
    "\\boxed{1/2}",
]


def _agreement_cases() -> list[tuple[str, str]]:
    cases = [(response, reference) for response, reference, _ in PAIRS]
    references = [
        "68",
        "67,68",
        "\\frac{1}{2}",
        "(-\\infty, 3]",
        "\\{1, 2, 3\\}",
        "\\text{(C)}",
        "10\\%",
        "\\$18.90",
    ]
    cases += [(response, reference) for response in GARBAGE + DECOYS for reference in references]
    # Each reference answered with itself, plainly and boxed: the shortcut's home ground.
    cases += [(reference, reference) for _, reference, _ in PAIRS]
    cases += [(f"\\boxed{{{reference}}}", reference) for _, reference, _ in PAIRS]
    return cases


def test_the_shortcut_gives_the_full_answer() -> None:
    # The shortcut skips sympy only where the answer cannot differ: same extracted text, same verdict.
    cases = _agreement_cases()
    differ = [
        (response, reference, fast, full)
        for response, reference in cases
        if (fast := grade(response, reference)) != (full := grade(response, reference, shortcut=False))
    ]
    taken = [case for case in cases if _shortcut(case[0], _reference(case[1])) is not None]

    assert differ == []
    # Not vacuous: the shortcut answers a good share of these (and all the toy model's right answers).
    assert len(taken) >= 100
    assert _shortcut("\\boxed{68}", _reference("68")) == Grade("68", True)


@pytest.mark.parametrize(
    ("response", "reference"),
    [("\\boxed{67}", "68"), ("\\boxed{0.50}", "\\frac{1}{2}"), ("\\boxed{x}", "x^2"), ("", "68"), ("68", "")],
)
def test_the_shortcut_never_says_wrong(response: str, reference: str) -> None:
    # A response it cannot vouch for goes through parse and verify, whatever it looks like.
    assert _shortcut(response, _reference(reference)) is None


def test_grades_outside_the_main_thread() -> None:
    # math-verify's timeouts use signal.alarm, which raises outside the main thread unless switched off.
    results: list[Grade] = []
    thread = threading.Thread(
        target=lambda: results.extend([grade("\\boxed{104}", "104"), grade("\\boxed{0.5}", "\\frac12")])
    )
    thread.start()
    thread.join()

    assert results == [Grade("104", True), Grade("\\frac{1}{2}", True)]
