"""Verdicts: what one test's execution means, and what a sample's tests add up to (pure).

A test is ``passed``, or failed with one of: ``wrong_answer`` (an assert failed, or the output differs
from the expected one), ``runtime_error`` (an exception, a crash, a non-zero exit, output past the file
size limit), ``compile_error`` (the code does not compile; for Python, a syntax error), ``timeout`` (the
CPU or wall-clock limit), ``memory`` (an allocation past the address-space limit). A sample's verdict is
``passed`` when every test passed, else that of its first failing test.
"""

from __future__ import annotations

import signal
from collections import Counter
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["passed", "wrong_answer", "runtime_error", "compile_error", "timeout", "memory"]

VERDICTS: tuple[Verdict, ...] = (
    "passed",
    "wrong_answer",
    "runtime_error",
    "compile_error",
    "timeout",
    "memory",
)

#: Signals a limit sends: SIGXCPU at the soft CPU limit, SIGKILL at the hard one.
_CPU_SIGNALS = frozenset({signal.SIGXCPU, signal.SIGKILL})


@dataclass(frozen=True)
class TestResult:
    # Not a pytest test class, whatever its name.
    __test__ = False

    #: What the test is: its assert code, or its input (cut for display by the caller).
    name: str
    verdict: Verdict
    #: What the program wrote: stdout, then stderr (or the compiler's messages).
    output: str = ""
    #: Stdin/stdout tests: the output expected.
    expected: str | None = None
    wall_s: float = 0.0


@dataclass(frozen=True)
class SampleResult:
    """One sample's code and its tests' results, in the problem's test order."""

    code: str
    tests: tuple[TestResult, ...]

    @property
    def passed(self) -> bool:
        return bool(self.tests) and all(test.verdict == "passed" for test in self.tests)

    @property
    def tests_passed(self) -> int:
        return sum(test.verdict == "passed" for test in self.tests)

    @property
    def first_failure(self) -> TestResult | None:
        return next((test for test in self.tests if test.verdict != "passed"), None)

    @property
    def verdict(self) -> Verdict:
        failure = self.first_failure
        return "passed" if failure is None else failure.verdict

    @property
    def counts(self) -> dict[str, int]:
        counted = Counter(test.verdict for test in self.tests)
        return {verdict: counted[verdict] for verdict in VERDICTS if counted[verdict]}


def same_output(actual: str, expected: str) -> bool:
    """Outputs compared line by line, trailing whitespace and trailing blank lines ignored (as the
    CodeContests and LiveCodeBench checkers do); anything else, spacing within a line included, counts."""
    return _lines(actual) == _lines(expected)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def limit_verdict(returncode: int, timed_out: bool) -> Verdict | None:
    """``timeout`` for an execution a time limit ended, else ``None``."""
    if timed_out:
        return "timeout"
    if returncode > 128 and returncode - 128 in _CPU_SIGNALS:
        return "timeout"
    return None


def last_exception(stderr: str) -> str | None:
    """The exception type a Python traceback ends with (``AssertionError``, ``MemoryError``), if any."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if not lines or not any(line.startswith("Traceback ") or "Error" in line for line in lines[-3:]):
        return None
    name = lines[-1].split(":", 1)[0].strip()
    return name.rsplit(".", 1)[-1] if name.replace(".", "").replace("_", "").isalnum() else None
