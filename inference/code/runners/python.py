"""Python: the solution and, for an assert test, the test code after it, run by ``python3 -I``."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import ClassVar

from inference.code.grading import Verdict, last_exception
from inference.code.problems import TestCase
from inference.code.runners.base import Program, Runner
from inference.code.sandbox import CHANNEL_IN, CHANNEL_OUT, FILES, Channel, Execution, Sandbox, SandboxFile

#: The harness that runs an assert test's program and tests in the sandbox (its text, read once).
HARNESS = SandboxFile("harness.py", (Path(__file__).parent / "python_harness.py").read_bytes())

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
        hidden = json.dumps({"nonce": nonce, "setup": setup, "test": test.code}).encode()
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
