"""C++: compiled once per sample by g++ in the sandbox (``-O2 -std=c++17``), run per stdin/stdout test."""

from __future__ import annotations

from typing import ClassVar

from inference.code.grading import TestResult, Verdict
from inference.code.problems import TestCase
from inference.code.runners.base import Program, Runner
from inference.code.sandbox import FILES, TMP, Execution, Sandbox, SandboxFile
from inference.errors import TaskInvalid

FLAGS = ("-O2", "-std=c++17", "-pipe")


class CppRunner(Runner):
    name: ClassVar[str] = "cpp"
    default_executable: ClassVar[str] = "g++"
    tags: ClassVar[tuple[str, ...]] = ("cpp", "c++", "cc", "cxx")

    def prepare(self, code: str, sandbox: Sandbox) -> Program | TestResult:
        if self.compile_limits is None:
            raise TaskInvalid("language 'cpp' needs compile limits")
        flags = " ".join(FLAGS)
        # The binary comes back on stdout (the sandbox keeps no file); the compiler's messages on stderr.
        script = f"{self.executable} {flags} -o {TMP}/a.out {FILES}/main.cpp >&2 && cat {TMP}/a.out"
        built = sandbox.run(
            ["/bin/sh", "-c", script], (SandboxFile("main.cpp", code.encode()),), b"", self.compile_limits
        )
        if built.returncode != 0 or built.timed_out or not built.stdout:
            said = built.stderr.decode("utf-8", "replace")
            if built.timed_out or built.signal is not None:
                said += f"\n(compilation stopped by its limits after {built.wall_s:.1f} s)"
            return TestResult(name="compile", verdict="compile_error", output=said)
        return Program((SandboxFile("a.out", built.stdout, executable=True),), (f"{FILES}/a.out",))

    def program(self, prepared: Program, test: TestCase, setup: str) -> Program:
        if test.code is not None:
            raise TaskInvalid("language 'cpp' runs stdin/stdout tests only, not assert tests")
        return prepared

    def crash_verdict(self, execution: Execution, test: TestCase) -> Verdict:
        if b"std::bad_alloc" in execution.stderr:
            return "memory"
        return "runtime_error"
