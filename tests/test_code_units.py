"""Code tasks' pure parts: extraction, the two dataset formats, verdicts, metrics and sample outputs."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from inference.code.extract import extract_code, fenced_blocks
from inference.code.grading import (
    SampleResult,
    TestResult,
    Verdict,
    last_exception,
    limit_verdict,
    same_output,
)
from inference.code.problems import read_problems
from inference.dataset import Item
from inference.errors import DatasetInvalid, TaskInvalid
from inference.generation import Generation
from inference.metrics import DEFAULT_METRICS, EvalRecord, SampleRecord, compute_metrics, resolve_metrics
from inference.samples import SampleLimits, grade_samples
from inference.spec import CodeSpec, SampleOutput

PY = ("python", "py")


def write_rows(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# Extraction.


def test_the_last_fenced_block_of_the_language_is_the_code() -> None:
    response = (
        "Try:\n```python\nx = 1\n```\nThen run it:\n```bash\npython x.py\n```\nFinal:\n```py\nx = 2\n```\n"
    )
    assert extract_code(response, tags=PY) == "x = 2\n"
    assert [tag for tag, _ in fenced_blocks(response)] == ["python", "bash", "py"]


def test_an_untagged_block_counts_and_a_cut_block_runs_to_the_end() -> None:
    assert extract_code("```\nprint(1)\n```", tags=PY) == "print(1)\n"
    assert extract_code("Here:\n```python\nprint(1)\nprint(2", tags=PY) == "print(1)\nprint(2"
    assert extract_code("````python\na = '```'\n````", tags=PY) == "a = '```'\n"


def test_without_a_fence_the_response_continues_the_prompt() -> None:
    prefix = "def f(x):\n    "
    assert extract_code("return x + 1\n", prefix=prefix, tags=PY) == "def f(x):\n    return x + 1\n"
    assert extract_code("```python\nreturn 1\n```", prefix=prefix, mode="append") == (
        prefix + "```python\nreturn 1\n```"
    )


def test_a_block_without_the_entry_point_is_its_body() -> None:
    prefix = "import math\n\ndef f(x):\n"
    body = "```python\n    return math.sqrt(x)\n```"
    assert extract_code(body, prefix=prefix, tags=PY, entry_point="f") == prefix + "    return math.sqrt(x)\n"
    whole = "```python\ndef f(x):\n    return 2\n```"
    assert extract_code(whole, prefix=prefix, tags=PY, entry_point="f") == "def f(x):\n    return 2\n"


def test_a_block_of_another_language_is_still_the_code() -> None:
    assert extract_code("```cpp\nint main(){}\n```", tags=PY, mode="fenced") == "int main(){}\n"
    assert extract_code("no fence at all", tags=PY, mode="fenced") == "no fence at all"


# Dataset formats.


def test_humaneval_rows_are_one_check_each(tmp_path: Path) -> None:
    row = {
        "task_id": "HumanEval/0",
        "prompt": "def add(a, b):\n",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
        "entry_point": "add",
    }
    path = tmp_path / "he.jsonl.gz"
    path.write_bytes(gzip.compress((json.dumps(row) + "\n").encode()))
    read = read_problems(path, CodeSpec(), id_field="task_id")
    (problem,) = read.problems
    assert read.items[0] == Item("HumanEval/0", "def add(a, b):\n", "    return a + b\n")
    assert problem.prefix == "def add(a, b):\n"
    assert problem.entry_point == "add"
    (test,) = problem.tests
    assert test.code is not None and test.code.endswith("\ncheck(add)")


def test_mbpp_rows_are_one_test_per_assert(tmp_path: Path) -> None:
    row = {
        "task_id": 2,
        "text": "Write a function to add.",
        "code": "def add(a, b):\n    return a + b",
        "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0"],
        "test_setup_code": "import math",
    }
    read = read_problems(write_rows(tmp_path / "mbpp.jsonl", [row]), CodeSpec())
    (problem,) = read.problems
    assert [t.code for t in problem.tests] == row["test_list"]
    assert (problem.prefix, problem.setup, read.items[0].prompt) == ("", "import math", row["text"])


def test_stdio_rows_in_each_shape(tmp_path: Path) -> None:
    cases = [{"input": "1\n", "output": "2\n"}, {"input": "3\n", "output": "6\n"}]
    rows = [
        {"question": "Double it.", "tests": cases},
        {"question": "Double it.", "input_output": json.dumps({"inputs": ["1\n"], "outputs": ["2\n"]})},
        {"description": "Double it.", "public_tests": {"input": ["1\n"], "output": ["2\n"]}},
        {"question_content": "Double.", "public_test_cases": json.dumps([{**cases[0], "testtype": "stdin"}])},
    ]
    read = read_problems(write_rows(tmp_path / "io.jsonl", rows), CodeSpec())
    assert [len(p.tests) for p in read.problems] == [2, 1, 1, 1]
    assert read.problems[0].tests[1].stdin == "3\n"
    assert read.problems[0].tests[1].expected == "6\n"
    assert not read.bad_rows


def test_a_row_without_tests_costs_only_itself_and_is_named(tmp_path: Path) -> None:
    rows = [
        {"prompt": "ok", "tests": [{"input": "", "output": "1"}]},
        {"prompt": "no tests here"},
        {"prompt": "empty", "test_list": []},
        {
            "prompt": "functional",
            "public_test_cases": [{"input": "1", "output": "2", "testtype": "functional"}],
        },
        {"prompt": "odd", "tests": [{"input": "1"}]},
    ]
    path = write_rows(tmp_path / "bad.jsonl", rows)
    read = read_problems(path, CodeSpec())
    assert len(read.items) == 1
    messages = {p.where: p.message for p in read.bad_rows}
    assert messages[f"{path}:2"].startswith("no tests (looked for 'test', 'test_list', 'tests'")
    assert messages[f"{path}:3"] == "field 'test_list' holds no tests"
    assert "test type 'functional' is not run" in messages[f"{path}:4"]
    assert messages[f"{path}:5"] == "field 'tests': each test needs 'input' and 'output'"
    with pytest.raises(DatasetInvalid, match=r"bad\.jsonl: no usable rows, all 1 are bad: .*:1: no tests"):
        read_problems(write_rows(tmp_path / "bad.jsonl", rows[1:2]), CodeSpec())


def test_a_configured_tests_field_decides_by_its_shape(tmp_path: Path) -> None:
    rows = [
        {"prompt": "p", "checks": ["assert True"]},
        {"prompt": "q", "checks": [{"input": "", "output": ""}]},
    ]
    read = read_problems(write_rows(tmp_path / "c.jsonl", rows), CodeSpec(tests_field="checks"))
    assert read.problems[0].tests[0].code == "assert True"
    assert read.problems[1].tests[0].expected == ""
    missing = read_problems(
        write_rows(tmp_path / "m.jsonl", [*rows, {"prompt": "r"}]), CodeSpec(tests_field="checks")
    )
    assert missing.bad_rows[0].message == "missing field 'checks' (tests_field)"


def test_an_unknown_language_and_a_missing_compiler_are_task_errors() -> None:
    from inference.code.judge import Judge

    with pytest.raises(TaskInvalid, match=r"task 't': unknown language 'rust' \(known: cpp, python\)"):
        Judge("t", CodeSpec(language="rust"))
    with pytest.raises(TaskInvalid, match=r"task 't': language 'cpp': g\+\+-404 is not installed"):
        Judge("t", CodeSpec(language="cpp", executable="g++-404"))


# Verdicts.


def test_outputs_compare_by_line_without_trailing_space() -> None:
    assert same_output("1 2\n3  \n\n\n", "1 2\n3")
    assert same_output("a\r\nb\r\n", "a\nb\n")
    assert not same_output("1  2\n", "1 2\n")
    assert not same_output("1\n\n2", "1\n2")


def test_limits_and_tracebacks_read_as_verdicts() -> None:
    assert limit_verdict(0, timed_out=True) == "timeout"
    assert limit_verdict(128 + 24, timed_out=False) == "timeout"  # SIGXCPU
    assert limit_verdict(128 + 11, timed_out=False) is None  # SIGSEGV: a crash
    # A SIGKILL before the CPU limit could have been reached was sent by the program to itself.
    assert limit_verdict(128 + 9, timed_out=False, wall_s=0.2, cpu_s=1.0) is None
    assert limit_verdict(128 + 9, timed_out=False, wall_s=1.5, cpu_s=1.0) == "timeout"
    trace = 'Traceback (most recent call last):\n  File "x", line 1\nAssertionError: 3 != 4\n'
    assert last_exception(trace) == "AssertionError"
    assert last_exception("  File 'x'\nnumpy.core._exceptions._ArrayMemoryError: no\n") == "_ArrayMemoryError"
    assert last_exception("just some output\n") is None


def sample(*verdicts: Verdict) -> SampleResult:
    return SampleResult(
        "code", tuple(TestResult(f"t{i}", v, output=f"out{i}") for i, v in enumerate(verdicts))
    )


def test_a_sample_is_its_first_failing_test() -> None:
    mixed = sample("passed", "timeout", "wrong_answer")
    assert (mixed.passed, mixed.verdict, mixed.tests_passed) == (False, "timeout", 1)
    assert mixed.counts == {"passed": 1, "wrong_answer": 1, "timeout": 1}
    assert sample("passed", "passed").verdict == "passed"
    assert not SampleResult("code", ()).passed


# Metrics and the samples people read.


def test_code_metrics_are_registered_for_code_tasks() -> None:
    names = DEFAULT_METRICS["code"]
    assert {"pass@1", "test_pass_rate", "timeout_rate", "compile_error_rate"} <= set(names)
    resolve_metrics(names, kind="code")
    with pytest.raises(TaskInvalid, match="does not apply to a generate task"):
        resolve_metrics(["test_pass_rate"], kind="generate")


def test_pass_rates_and_verdict_shares() -> None:
    def record(group: int, passed: int, total: int, verdict: str) -> SampleRecord:
        return SampleRecord(
            correct=passed == total, tokens=1, truncated=False, group=group, tests_passed=passed,
            tests_total=total, verdict=verdict,
        )  # fmt: skip

    samples = (record(0, 2, 2, "passed"), record(0, 1, 2, "timeout"), record(1, 0, 4, "compile_error"))
    names = ("pass@1", "test_pass_rate", "timeout_rate", "compile_error_rate", "wrong_answer_rate")
    values = {v.name: v for v in compute_metrics(resolve_metrics(names, kind="code"), EvalRecord(samples))}
    assert values["pass@1"].value == pytest.approx((0.5 + 0.0) / 2)
    assert values["test_pass_rate"].value == pytest.approx((1 + 0.5 + 0) / 3)
    assert values["timeout_rate"].value == pytest.approx(1 / 3)
    assert values["timeout_rate"].n == 3
    assert values["compile_error_rate"].value == pytest.approx(1 / 3)
    assert values["wrong_answer_rate"].value == 0.0
    assert not math.isnan(values["test_pass_rate"].stderr or 0.0)


def test_a_code_sample_carries_its_verdict_and_failing_test() -> None:
    items = [Item("a", "double it", "")]
    failing = TestResult("input:\n2\n", "wrong_answer", output="5\n", expected="4\n")
    results = [
        SampleResult("print(5)", (TestResult("input:\n1\n", "passed"), failing)),
        SampleResult("print(2*int(input()))", (TestResult("input:\n1\n", "passed"),) * 2),
    ]
    generations = [Generation("print(5)", 3, False), Generation("ok", 5, False)]
    graded = grade_samples("t", items, ["p"], generations, SampleLimits(2, 10, 1000), None, results)
    first, second = graded.outputs
    assert (first.correct, first.verdict, first.tests_passed, first.tests_total) == (
        False,
        "wrong_answer",
        1,
        2,
    )
    assert first.verdicts == {"passed": 1, "wrong_answer": 1}
    assert first.failed_test == "input:\n2\n\nexpected:\n4\n"
    assert (first.failed_output, first.extracted) == ("5\n", "print(5)")
    assert (second.correct, second.verdict, second.failed_test) == (True, "passed", None)
    assert [(r.tests_passed, r.verdict) for r in graded.records] == [(1, "wrong_answer"), (2, "passed")]


def test_old_sample_outputs_still_read() -> None:
    old = {
        "index": 0, "prompt_id": "1", "prompt": "p", "response": "r", "extracted": None, "reference": "",
        "correct": True, "tokens": 1, "truncated": False,
    }  # fmt: skip
    read = SampleOutput.model_validate(old)
    assert read.verdict is None
    # Unset, the code fields stay out of the dump: readers that map each key to a column see no change.
    assert read.model_dump() == {**old, "reward": None, "entropy": None, "error": None}
    judged = read.model_copy(update={"verdict": "timeout", "verdicts": {"timeout": 1}})
    assert SampleOutput.model_validate_json(judged.model_dump_json()) == judged
