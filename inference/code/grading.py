"""Verdicts: what one test's execution means, and what a sample's tests add up to (pure).

A test is ``passed``, or failed with one of: ``wrong_answer`` (an assert failed, or the output differs
from the expected one), ``runtime_error`` (an exception, a crash, a non-zero exit, output past the file
size limit), ``compile_error`` (the code does not compile; for Python, a syntax error), ``timeout`` (the
CPU or wall-clock limit), ``memory`` (an allocation past the address-space limit), ``interfered`` (the
program tampered with its tests or the harness: see :mod:`inference.code.runners.python_harness`). A
sample's verdict is ``passed`` when every test passed, else that of its first failing test.

Stdin/stdout outputs are compared as the task's ``compare`` says (:data:`COMPARISONS`).
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal

Verdict = Literal[
    "passed", "wrong_answer", "runtime_error", "compile_error", "timeout", "memory", "interfered"
]

VERDICTS: tuple[Verdict, ...] = (
    "passed",
    "wrong_answer",
    "runtime_error",
    "compile_error",
    "timeout",
    "memory",
    "interfered",
)

#: How a stdin/stdout test's output is compared with the one expected:
#:
#: - ``exact``: the same text, but for line endings (``\r\n``) and newlines at the very end;
#: - ``lines``: line by line, trailing whitespace of each line and trailing blank lines ignored;
#: - ``tokens``: the same whitespace-separated tokens (Codeforces' default checker, testlib's ``wcmp``);
#: - ``float``: tokens, where two numbers are equal within the tolerance, absolute or relative (testlib's
#:   ``rcmp6`` at 1e-6); two integers must be equal, a tolerance of 0 compares decimal values exactly.
Comparison = Literal["exact", "lines", "tokens", "float"]
COMPARISONS: tuple[Comparison, ...] = ("exact", "lines", "tokens", "float")

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")

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


def same_output(actual: str, expected: str, compare: Comparison = "lines", tolerance: float = 1e-6) -> bool:
    """Whether ``actual`` is ``expected`` as ``compare`` says (:data:`COMPARISONS`)."""
    if compare == "exact":
        return _unix(actual).rstrip("\n") == _unix(expected).rstrip("\n")
    if compare == "lines":
        return _lines(actual) == _lines(expected)
    got, wanted = actual.split(), expected.split()
    if compare == "tokens" or len(got) != len(wanted):
        return got == wanted
    return all(a == b or _close(a, b, tolerance) for a, b in zip(got, wanted, strict=True))


def _close(actual: str, expected: str, tolerance: float) -> bool:
    if not (_NUMBER.fullmatch(actual) and _NUMBER.fullmatch(expected)):
        return False
    if _INTEGER.fullmatch(actual) and _INTEGER.fullmatch(expected):
        return int(actual) == int(expected)
    try:
        a, b = Decimal(actual), Decimal(expected)
    except InvalidOperation:
        return False
    difference = abs(a - b)
    bound = Decimal(tolerance)
    return difference <= bound or difference <= bound * abs(b)


def _unix(text: str) -> str:
    return text.replace("\r\n", "\n")


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in _unix(text).split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def limit_verdict(
    returncode: int, timed_out: bool, wall_s: float | None = None, cpu_s: float | None = None
) -> Verdict | None:
    """``timeout`` for an execution a time limit ended, else ``None``. A SIGXCPU or SIGKILL counts as
    the CPU limit only after ``cpu_s`` of wall clock (when both are given): the limit is per process, so a
    process killed sooner sent it to itself (``os.kill(os.getpid(), SIGKILL)``), a ``runtime_error``.
    (A process running several threads at once could reach its CPU limit sooner; judged programs do not.)"""
    if timed_out:
        return "timeout"
    if returncode > 128 and returncode - 128 in _CPU_SIGNALS:
        if wall_s is not None and cpu_s is not None and wall_s < cpu_s:
            return None
        return "timeout"
    return None


def last_exception(stderr: str) -> str | None:
    """The exception type a Python traceback ends with (``AssertionError``, ``MemoryError``), if any."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if not lines or not any(line.startswith("Traceback ") or "Error" in line for line in lines[-3:]):
        return None
    name = lines[-1].split(":", 1)[0].strip()
    return name.rsplit(".", 1)[-1] if name.replace(".", "").replace("_", "").isalnum() else None
