"""Python: the solution and, for an assert test, the test code after it, run by ``python3 -I``."""

from __future__ import annotations

import ast
import functools
import secrets
import threading
from pathlib import Path
from typing import ClassVar

from inference.code.grading import Verdict, last_exception
from inference.code.problems import TestCase
from inference.code.runners.base import Program, Runner
from inference.code.runners.python_harness import CHECK
from inference.code.sandbox import CHANNEL_IN, CHANNEL_OUT, FILES, Channel, Execution, Sandbox, SandboxFile

#: The harness that runs an assert test's program and tests in the sandbox (its text, read once).
HARNESS = SandboxFile("harness.py", (Path(__file__).parent / "python_harness.py").read_bytes())

#: Held while a test's syntax tree is built. CPython 3.11 keeps the AST constructor's recursion count in
#: state all threads share, so two judge threads parsing at once can fail one of them with "SystemError: AST
#: constructor recursion depth mismatch" (seen in a test run; python/cpython#106905 is a kin of it).
_PARSING = threading.Lock()

#: Exceptions raised before any line runs: the code does not compile.
_SYNTAX = frozenset({"SyntaxError", "IndentationError", "TabError"})


class PythonRunner(Runner):
    name: ClassVar[str] = "python"
    default_executable: ClassVar[str] = "python3"
    runs_asserts: ClassVar[bool] = True
    tags: ClassVar[tuple[str, ...]] = ("python", "py", "python3")

    def prepare(self, code: str, sandbox: Sandbox) -> Program:
        # Nothing to compile: a syntax error shows up as each test's run fails.
        return Program((SandboxFile("main.py", code.encode()),), self._argv())

    def program(self, prepared: Program, test: TestCase, setup: str) -> Program:
        if test.code is None:
            return prepared
        # The program's file holds its code only; the tests and the nonce go on the harness's descriptor.
        nonce = secrets.token_hex(16)
        hidden = "\0".join((nonce, setup, checked_tests(test.code))).encode()
        harness = f"{FILES}/{HARNESS.name}"
        argv = (str(self.executable), "-I", harness, CHANNEL_IN, CHANNEL_OUT, f"{FILES}/main.py")
        return Program((*prepared.files, HARNESS), argv, Channel(hidden), nonce)

    def crash_verdict(self, execution: Execution, test: TestCase) -> Verdict:
        raised = last_exception(execution.stderr.decode("utf-8", "replace"))
        if raised in _SYNTAX:
            return "compile_error"
        if raised == "MemoryError":
            return "memory"
        if raised == "AssertionError" and test.code is not None:
            return "wrong_answer"
        return "runtime_error"

    def _argv(self) -> tuple[str, ...]:
        # -I: no user site, no PYTHON* variables, no script folder first on sys.path.
        return (str(self.executable), "-I", f"{FILES}/main.py")


class _Checked(ast.NodeTransformer):
    """Wraps each comparison operand, assert condition, ``not`` operand and ``and``/``or`` operand in a
    call of the check (which returns the value unchanged: the test's meaning and order stay the same)."""

    def _wrap(self, node: ast.expr) -> ast.expr:
        call = ast.Call(func=ast.Name(id=CHECK, ctx=ast.Load()), args=[node], keywords=[])
        return ast.copy_location(call, node)

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        node.left = self._wrap(node.left)
        node.comparators = [self._wrap(value) for value in node.comparators]
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.AST:
        self.generic_visit(node)
        node.test = self._wrap(node.test)
        return node

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            node.operand = self._wrap(node.operand)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        node.values = [self._wrap(value) for value in node.values]
        return node


@functools.lru_cache(maxsize=256)
def checked_tests(source: str) -> str:
    """The test code with its comparisons and asserts passed through the harness's value check, as
    source (the harness need not import ``ast``); a test that does not parse is left as it is, for the
    harness to report as a syntax error. Kept per source: every sample of a problem runs the same tests."""
    with _PARSING:
        try:
            tree = ast.parse(source, "<tests>")
        except (SyntaxError, ValueError):
            return source
    return ast.unparse(ast.fix_missing_locations(_Checked().visit(tree)))
