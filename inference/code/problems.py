"""Code problems: JSONL (or ``.jsonl.gz``) rows with tests, in the two common formats.

- **assert** (HumanEval, MBPP): a ``test`` string of code run after the solution, with ``check(ENTRY)``
  appended when the row has an ``entry_point`` (HumanEval: one test per problem); or a ``test_list`` of
  assert statements, one test each, after an optional ``test_setup_code`` (MBPP).
- **stdio** (CodeContests, LiveCodeBench, APPS): inputs and the outputs expected, as a list of
  ``{"input", "output"}`` objects, or ``{"input": [...], "output": [...]}`` (``inputs``/``outputs``
  too), either one possibly a JSON string of itself.

A row's prompt is ``prompt_field`` or the first of ``prompt``, ``question``, ``problem``, ``text``,
``question_content``, ``description``; its id is ``id_field`` or its line number. A row that cannot be
used (no tests, an empty test list, a LiveCodeBench ``functional`` test) costs only itself: it is
reported as a :class:`~inference.spec.Problem` named by ``FILE:LINE``, like any dataset row.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.code.grading import Comparison
from inference.dataset import MAX_ID_CHARS, Item
from inference.errors import DatasetInvalid
from inference.spec import CodeSpec, Problem

PROMPT_FIELDS = ("prompt", "question", "problem", "text", "question_content", "description")
ASSERT_FIELDS = ("test", "test_list")
STDIO_FIELDS = ("tests", "input_output", "public_tests", "public_test_cases")
#: ``compare = "auto"``: the comparison each stdio field's datasets judge with (their checkers tokenise,
#: and APPS, CodeContests and LiveCodeBench accept numbers that differ only in formatting or precision).
AUTO_COMPARE: dict[str, Comparison] = {
    "input_output": "float",
    "public_tests": "float",
    "public_test_cases": "float",
    "tests": "tokens",
}
#: Fields a row's reference solution (shown beside samples, never run) is taken from.
REFERENCE_FIELDS = ("canonical_solution", "code", "solution")


@dataclass(frozen=True)
class TestCase:
    """One test: assert-style ``code`` run after the solution, or ``stdin`` and the ``expected`` output."""

    # Not a pytest test class, whatever its name.
    __test__ = False

    name: str
    code: str | None = None
    stdin: str | None = None
    expected: str | None = None
    #: Stdin/stdout tests: how the output is compared (:data:`~inference.code.grading.COMPARISONS`).
    compare: Comparison = "lines"
    #: ``compare = "float"``: the absolute or relative difference two numbers may have.
    tolerance: float = 1e-6


@dataclass(frozen=True)
class CodeProblem:
    prompt_id: str
    #: Code the response continues when it is appended (HumanEval's function signature); may be empty.
    prefix: str
    #: Code an assert test needs before it (MBPP's ``test_setup_code``).
    setup: str
    tests: tuple[TestCase, ...]
    #: The function an assert test checks; extraction keeps the prefix when a block lacks it.
    entry_point: str | None = None


@dataclass(frozen=True)
class CodeDataset:
    items: tuple[Item, ...]
    problems: tuple[CodeProblem, ...]
    #: Rows left out, each with its ``FILE:LINE`` and what is wrong.
    bad_rows: tuple[Problem, ...] = ()


def read_problems(
    path: Path,
    spec: CodeSpec,
    *,
    prompt_field: str | None = None,
    id_field: str | None = None,
    limit: int | None = None,
    stratify_fields: Sequence[str] = (),
) -> CodeDataset:
    """Every usable row of ``path`` (the first ``limit``), as items to generate from and problems to
    test; a file that cannot be read, or has no usable row, is :class:`DatasetInvalid`."""
    items: list[Item] = []
    problems: list[CodeProblem] = []
    bad: list[Problem] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(_lines(path), start=1):
        if limit is not None and len(items) == limit:
            break
        where = f"{path}:{number}"
        if not raw.strip():
            continue
        try:
            row = _row(raw, where)
            prompt_id = str(number) if id_field is None else _text(row, id_field, where)
            if len(prompt_id) > MAX_ID_CHARS:
                raise DatasetInvalid(f"{where}: id longer than {MAX_ID_CHARS} characters")
            if prompt_id in seen:
                raise DatasetInvalid(f"{where}: duplicate id {prompt_id!r} (first on line {seen[prompt_id]})")
            prompt_name = prompt_field or next((f for f in PROMPT_FIELDS if f in row), PROMPT_FIELDS[0])
            prompt = _text(row, prompt_name, where)
            problem = _problem(row, spec, prompt_id, prompt_name, where)
            strata = tuple((field, _text(row, field, where)) for field in dict.fromkeys(stratify_fields))
        except DatasetInvalid as exc:
            bad.append(Problem(where=where, message=exc.message.removeprefix(f"{where}: ")))
            continue
        seen[prompt_id] = number
        reference = next((row[f] for f in REFERENCE_FIELDS if isinstance(row.get(f), str)), "")
        items.append(Item(prompt_id=prompt_id, prompt=prompt, reference=reference, strata=strata))
        problems.append(problem)
    if not items:
        shown = "; ".join(f"{p.where}: {p.message}" for p in bad[:3])
        raise DatasetInvalid(
            f"{path}: no usable rows" + (f", all {len(bad)} are bad: {shown}" if bad else "")
        )
    return CodeDataset(tuple(items), tuple(problems), tuple(bad))


def _problem(
    row: dict[str, Any], spec: CodeSpec, prompt_id: str, prompt_name: str, where: str
) -> CodeProblem:
    field = spec.tests_field or _tests_field(row, spec, where)
    if field not in row:
        raise DatasetInvalid(f"{where}: missing field {field!r} (tests_field)")
    entry = row.get(spec.entry_point_field)
    entry_point = entry if isinstance(entry, str) and entry.strip() else None
    assert_style = spec.test_format == "assert" or (
        spec.test_format == "auto" and _asserts(field, row[field])
    )
    if assert_style:
        tests = _assert_tests(row[field], entry_point, where, field)
    else:
        compare = AUTO_COMPARE.get(field, "tokens") if spec.compare == "auto" else spec.compare
        tests = tuple(
            dataclasses.replace(test, compare=compare, tolerance=spec.float_tolerance)
            for test in _stdio_tests(row[field], where, field)
        )
    if not tests:
        raise DatasetInvalid(f"{where}: field {field!r} holds no tests")
    prefix_name = spec.prefix_field or (prompt_name if entry_point is not None else None)
    prefix = "" if prefix_name is None else _text(row, prefix_name, where)
    setup = row.get("test_setup_code")
    return CodeProblem(
        prompt_id=prompt_id,
        prefix=prefix,
        setup=setup if isinstance(setup, str) else "",
        tests=tests,
        entry_point=entry_point,
    )


def _tests_field(row: dict[str, Any], spec: CodeSpec, where: str) -> str:
    candidates = {
        "assert": ASSERT_FIELDS,
        "stdio": STDIO_FIELDS,
        "auto": ASSERT_FIELDS + STDIO_FIELDS,
    }[spec.test_format]
    found = next((field for field in candidates if field in row), None)
    if found is None:
        names = ", ".join(repr(f) for f in candidates)
        raise DatasetInvalid(f"{where}: no tests (looked for {names}; set tests_field to choose one)")
    return found


def _asserts(field: str, value: Any) -> bool:
    """``auto``: whether a field holds assert tests, by its name or else its shape (code, or a list of
    statements, rather than JSON input/output pairs)."""
    if field in ASSERT_FIELDS or field in STDIO_FIELDS:
        return field in ASSERT_FIELDS
    if isinstance(value, list):
        return all(isinstance(test, str) for test in value)
    return isinstance(value, str) and not value.lstrip().startswith(("[", "{"))


def _assert_tests(value: Any, entry_point: str | None, where: str, field: str) -> tuple[TestCase, ...]:
    if isinstance(value, str):
        if not value.strip():
            return ()
        code = value if entry_point is None else f"{value}\ncheck({entry_point})"
        return (TestCase(name=f"check({entry_point})" if entry_point else field, code=code),)
    if isinstance(value, list) and all(isinstance(test, str) for test in value):
        return tuple(TestCase(name=test.strip(), code=test) for test in value if test.strip())
    raise DatasetInvalid(
        f"{where}: field {field!r} must be test code or a list of asserts, got {_kind(value)}"
    )


def _stdio_tests(value: Any, where: str, field: str) -> tuple[TestCase, ...]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DatasetInvalid(f"{where}: field {field!r} is a string but not JSON: {exc.msg}") from exc
    pairs: list[tuple[Any, Any]]
    if isinstance(value, dict):
        inputs = value.get("input", value.get("inputs"))
        outputs = value.get("output", value.get("outputs"))
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            raise DatasetInvalid(f"{where}: field {field!r} needs lists 'input' and 'output' of one length")
        pairs = list(zip(inputs, outputs, strict=True))
    elif isinstance(value, list):
        pairs = []
        for case in value:
            if not isinstance(case, dict) or "input" not in case or "output" not in case:
                raise DatasetInvalid(f"{where}: field {field!r}: each test needs 'input' and 'output'")
            if case.get("testtype", "stdin") != "stdin":
                raise DatasetInvalid(
                    f"{where}: field {field!r}: test type {case['testtype']!r} is not run (stdin only)"
                )
            pairs.append((case["input"], case["output"]))
    else:
        raise DatasetInvalid(f"{where}: field {field!r} must hold stdin/stdout tests, got {_kind(value)}")
    tests = []
    for number, (given, expected) in enumerate(pairs, start=1):
        if not isinstance(given, str) or not isinstance(expected, str):
            raise DatasetInvalid(f"{where}: field {field!r}: test {number} needs text input and output")
        tests.append(TestCase(name=f"test {number}", stdin=given, expected=expected))
    return tuple(tests)


def _lines(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise DatasetInvalid(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from exc
    return data.splitlines()


def _row(raw: bytes, where: str) -> dict[str, Any]:
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DatasetInvalid(f"{where}: not UTF-8 (byte {exc.start + 1})") from exc
    except json.JSONDecodeError as exc:
        raise DatasetInvalid(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from exc
    if not isinstance(row, dict):
        raise DatasetInvalid(f"{where}: expected a JSON object, got {_kind(row)}")
    return row


def _text(row: dict[str, Any], field: str, where: str) -> str:
    if field not in row:
        raise DatasetInvalid(f"{where}: missing field {field!r}")
    value = row[field]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise DatasetInvalid(f"{where}: field {field!r} must be non-empty text, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
