"""The C++ runner for real: g++ in the sandbox, then each stdin/stdout test, with every verdict it gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inference.code.judge import Judge
from inference.code.problems import CodeProblem, TestCase, read_problems
from inference.errors import TaskInvalid
from inference.spec import CodeLimits, CodeSpec

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")

SPEC = CodeSpec(
    language="cpp",
    limits=CodeLimits(cpu_s=1, wall_s=4, memory_mb=256, processes=16, file_mb=10, open_files=64, tmp_mb=16),
    parallel=4,
    compile_s=30,
)
SUM = CodeProblem(
    "sum",
    "",
    "",
    (TestCase("1", stdin="1 2\n", expected="3\n"), TestCase("2", stdin="40 2\n", expected="42\n")),
)
HEADER = "#include <iostream>\n#include <vector>\nusing namespace std;\n"
RIGHT = HEADER + "int main() { long a, b; cin >> a >> b; cout << a + b << endl; }\n"


def fenced(code: str) -> str:
    return f"Here is my solution.\n```cpp\n{code}```\n"


def test_each_verdict_of_a_compiled_program() -> None:
    judge = Judge("cpp", SPEC)
    judge.check([SUM])
    programs = {
        "passed": RIGHT,
        "wrong_answer": HEADER + "int main() { long a, b; cin >> a >> b; cout << a - b << endl; }\n",
        "partly": HEADER + "int main() { long a, b; cin >> a >> b; cout << (a == 1 ? 3 : 0) << endl; }\n",
        "compile_error": HEADER + "int main() { return undefined_name; }\n",
        "runtime_error": HEADER + "int main() { int *p = nullptr; *p = 1; }\n",
        "timeout": HEADER + "int main() { volatile long x = 0; while (true) x++; }\n",
        "memory": HEADER + "int main() { vector<long> v(20L << 30); cout << v[1]; }\n",
    }
    results = dict(
        zip(programs, judge.judge([(SUM, fenced(code)) for code in programs.values()]), strict=True)
    )
    assert {name: result.verdict for name, result in results.items()} == {
        **{name: name for name in programs if name != "partly"},
        "partly": "wrong_answer",
    }
    assert results["passed"].code == RIGHT
    assert (results["partly"].tests_passed, len(results["partly"].tests)) == (1, 2)
    compile_failure = results["compile_error"].first_failure
    assert compile_failure is not None and "undefined_name" in compile_failure.output
    assert results["compile_error"].counts == {"compile_error": 2}


def test_a_stdio_dataset_in_cpp(tmp_path: Path) -> None:
    path = tmp_path / "sum.jsonl"
    path.write_text('{"question": "Add.", "tests": [{"input": "2 3\\n", "output": "5"}]}\n', encoding="utf-8")
    read = read_problems(path, SPEC)
    (result,) = Judge("cpp", SPEC).judge([(read.problems[0], fenced(RIGHT))])
    assert result.passed


def test_assert_tests_are_refused_for_cpp_naming_a_row() -> None:
    asserted = CodeProblem("HumanEval/0", "", "", (TestCase("check", code="assert True"),))
    with pytest.raises(TaskInvalid, match=r"'cpp' runs stdin/stdout tests only.*'HumanEval/0'"):
        Judge("cpp", SPEC).check([asserted])
