"""Stdin/stdout comparison modes against the rules the datasets' own checkers document.

- Codeforces (and CodeContests, drawn from it): testlib's default ``wcmp`` compares whitespace-separated
  tokens; problems with real answers use ``rcmp6``-style checkers, an absolute or relative error of 1e-6.
- APPS (``testing_util.py``): outputs split into tokens, numbers compared with a tolerance
  (``np.allclose``), so formatting and precision of floats do not matter.
- LiveCodeBench (``compare_strings``): stripped lines whose tokens are compared as ``Decimal`` values, so
  ``1.0`` equals ``1``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.code.grading import same_output
from inference.code.judge import Judge
from inference.code.problems import CodeProblem, TestCase, read_problems
from inference.spec import CodeLimits, CodeSpec


def test_exact_ignores_only_line_endings_and_final_newlines() -> None:
    assert same_output("1 2\r\n", "1 2", "exact")
    assert not same_output("1  2\n", "1 2\n", "exact")
    assert not same_output("1 2 \n", "1 2\n", "exact")
    assert not same_output("\n1 2\n", "1 2\n", "exact")


def test_lines_ignores_trailing_space_and_blank_lines_at_the_end() -> None:
    assert same_output("1 2  \n3\n\n", "1 2\n3", "lines")
    assert not same_output("\n1 2\n", "1 2\n", "lines")  # a leading blank line counts
    assert not same_output("1  2\n", "1 2\n", "lines")


def test_tokens_is_codeforces_wcmp() -> None:
    assert same_output("1  2\n", "1 2\n", "tokens")
    assert same_output("\n1 2\n", "1 2", "tokens")  # a leading blank line
    assert same_output("1\n2\n", "1 2\n", "tokens")  # wcmp ignores the line structure
    assert not same_output("1 2 3", "1 2", "tokens")
    assert not same_output("YES", "yes", "tokens")
    assert not same_output("0.3333333333", "0.333333", "tokens")


def test_float_is_rcmp6_with_exact_integers() -> None:
    assert same_output("0.3333333333333333\n", "0.333333\n", "float")  # print(1/3)
    assert same_output("0.3333333333\n", "0.333333", "float")  # printf("%.10f")
    assert same_output("1000000.5", "1000000.0", "float")  # relative 5e-7
    assert same_output("1e-7", "0", "float")  # absolute 1e-7
    assert same_output("2.0 YES", "2 YES", "float")
    assert not same_output("0.33", "0.333333", "float")
    assert not same_output("1000000001", "1000000000", "float")  # integers compare exactly
    assert not same_output("nan", "nan0", "float")
    assert not same_output("1 2", "1", "float")
    assert not same_output("YES 1.0", "NO 1.0", "float")


def test_float_with_no_tolerance_is_livecodebench_decimal_equality() -> None:
    assert same_output("1.0", "1", "float", tolerance=0)
    assert same_output("0.50", "0.5", "float", tolerance=0)
    assert not same_output("0.3333333", "0.333333", "float", tolerance=0)


def _rows(path: Path, field: str) -> Path:
    tests = {"inputs": ["1\n"], "outputs": ["0.5\n"]}
    value = json.dumps(tests) if field == "input_output" else [{"input": "1\n", "output": "0.5\n"}]
    path.write_text(json.dumps({"question": "halve", field: value}) + "\n")
    return path


@pytest.mark.parametrize(
    ("field", "mode"),
    [
        ("input_output", "float"),
        ("public_tests", "float"),
        ("public_test_cases", "float"),
        ("tests", "tokens"),
    ],
)
def test_auto_takes_the_comparison_the_dataset_shape_implies(tmp_path: Path, field: str, mode: str) -> None:
    read = read_problems(_rows(tmp_path / "rows.jsonl", field), CodeSpec())
    assert read.problems[0].tests[0].compare == mode
    chosen = read_problems(tmp_path / "rows.jsonl", CodeSpec(compare="exact", float_tolerance=0.01))
    assert (chosen.problems[0].tests[0].compare, chosen.problems[0].tests[0].tolerance) == ("exact", 0.01)


def test_the_judge_compares_as_the_test_says() -> None:
    judge = Judge("compare", CodeSpec(limits=CodeLimits(cpu_s=2, wall_s=20, memory_mb=512)))
    third = "print(1 / 3)\n"
    spaced = "print('1  2')\n"

    def problem(compare: str) -> CodeProblem:
        tests = (TestCase("a", stdin="", expected="0.333333\n", compare=compare),)  # type: ignore[arg-type]
        return CodeProblem(compare, "", "", tests)

    def spaced_problem(compare: str) -> CodeProblem:
        tests = (TestCase("b", stdin="", expected="1 2\n", compare=compare),)  # type: ignore[arg-type]
        return CodeProblem(compare, "", "", tests)

    results = judge.judge(
        [
            (problem("lines"), third),
            (problem("float"), third),
            (spaced_problem("lines"), spaced),
            (spaced_problem("tokens"), spaced),
        ]
    )
    assert [r.verdict for r in results] == ["wrong_answer", "passed", "wrong_answer", "passed"]
