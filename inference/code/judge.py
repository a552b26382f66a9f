"""Judging a job's code samples: extraction, preparation (compilation) and every test, in parallel.

Executions wait on sandboxed processes, so a pool of ``parallel`` threads keeps that many running at once;
the worker holds no lock meanwhile. Each distinct program is prepared (compiled) once, and each distinct
(program, test) run once: with sampling, identical completions are common.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import structlog

from inference.code.extract import extract_code
from inference.code.grading import SampleResult, TestResult
from inference.code.problems import CodeProblem, TestCase
from inference.code.runners import Program, Runner, runner_for
from inference.code.runners.base import compile_limits
from inference.code.sandbox import Limits, Sandbox, sandbox_for
from inference.errors import TaskInvalid
from inference.spec import CodeLimits, CodeSpec

log = structlog.get_logger("inference.code")

#: Characters kept of a failed test's stdout (its start) and stderr (its end, where the error is).
STDOUT_CHARS = 2000
STDERR_CHARS = 4000


def limits_of(spec: CodeLimits) -> Limits:
    return Limits(
        cpu_s=spec.cpu_s,
        wall_s=spec.wall_s,
        memory_mb=spec.memory_mb,
        processes=spec.processes,
        file_mb=spec.file_mb,
        open_files=spec.open_files,
        tmp_mb=spec.tmp_mb,
    )


class Judge:
    """Runs samples' code against their problems' tests, as a code task's spec says."""

    def __init__(self, task_name: str, spec: CodeSpec) -> None:
        self.task_name = task_name
        self.spec = spec
        self.limits = limits_of(spec.limits)
        try:
            self.runner: Runner = runner_for(
                spec.language,
                spec.executable,
                compile_limits=compile_limits(self.limits, spec.compile_s, spec.compile_memory_mb),
            )
            self.sandbox: Sandbox = sandbox_for(spec.sandbox, self.runner.readable)
        except TaskInvalid as exc:
            raise TaskInvalid(f"task {task_name!r}: {exc}") from exc

    def check(self, problems: Sequence[CodeProblem] = ()) -> None:
        """Start a sandbox and run the toolchain in it once, and check the problems' tests suit the
        language: each is :class:`TaskInvalid` naming what is missing, before any model is loaded."""
        where = f"task {self.task_name!r}"
        if not self.runner.runs_asserts:
            asserting = [p.prompt_id for p in problems if any(t.code is not None for t in p.tests)]
            if asserting:
                raise TaskInvalid(
                    f"{where}: language {self.runner.name!r} runs stdin/stdout tests only, and "
                    f"{len(asserting)} problems have assert tests (the first: {asserting[0]!r})"
                )
        try:
            self.sandbox.check(self.limits)
            version = self.sandbox.run([str(self.runner.executable), "--version"], (), b"", self.limits)
        except TaskInvalid as exc:
            raise TaskInvalid(f"{where}: {exc}") from exc
        if version.returncode != 0:
            said = version.stderr.decode("utf-8", "replace").strip()[-500:]
            raise TaskInvalid(
                f"{where}: {self.runner.executable} does not run in the {self.sandbox.name} sandbox "
                f"(exit status {version.returncode}): {said}"
            )
        if self.sandbox.name == "none":
            log.warning("code.unsandboxed", task=self.task_name, reason="sandbox = 'none' in the task")

    def code_of(self, problem: CodeProblem, response: str) -> str:
        return extract_code(
            response,
            prefix=problem.prefix,
            mode=self.spec.extract,
            tags=self.runner.tags,
            entry_point=problem.entry_point,
        )

    def judge(self, submissions: Sequence[tuple[CodeProblem, str]]) -> list[SampleResult]:
        """Each ``(problem, response)``'s result, in order."""
        codes = [self.code_of(problem, response) for problem, response in submissions]
        with ThreadPoolExecutor(self.spec.parallel, thread_name_prefix="evald-code") as pool:
            distinct = list(dict.fromkeys(codes))
            prepared = dict(zip(distinct, pool.map(self._prepare, distinct), strict=True))
            runs: dict[tuple[str, str, int], Future[TestResult]] = {}
            for (problem, _), code in zip(submissions, codes, strict=True):
                program = prepared[code]
                if not isinstance(program, Program):
                    continue
                for number, test in enumerate(problem.tests):
                    key = (code, problem.prompt_id, number)
                    if key not in runs:
                        runs[key] = pool.submit(self._run, program, problem, test)
            results = []
            for (problem, _), code in zip(submissions, codes, strict=True):
                program = prepared[code]
                if isinstance(program, Program):
                    tests = tuple(
                        runs[(code, problem.prompt_id, n)].result() for n in range(len(problem.tests))
                    )
                else:
                    tests = tuple(_compile_failed(program, test) for test in problem.tests)
                results.append(SampleResult(code=code, tests=tests))
        return results

    def _prepare(self, code: str) -> Program | TestResult:
        return self.runner.prepare(code, self.sandbox)

    def _run(self, prepared: Program, problem: CodeProblem, test: TestCase) -> TestResult:
        program = self.runner.program(prepared, test, problem.setup)
        stdin = (test.stdin or "").encode()
        execution = self.sandbox.run(program.argv, program.files, stdin, self.limits)
        verdict = self.runner.verdict(execution, test, program)
        output = ""
        if verdict != "passed":
            stdout = execution.stdout.decode("utf-8", "replace")
            stderr = execution.stderr.decode("utf-8", "replace")
            if program.sentinel is not None:
                stdout = stdout.replace(f"\n{program.sentinel}\n", "")
            output = _joined(stdout[:STDOUT_CHARS], stderr[-STDERR_CHARS:])
            if verdict == "timeout":
                output = _joined(output, f"(stopped by the time limit after {execution.wall_s:.1f} s)")
        return TestResult(
            name=_name(test), verdict=verdict, output=output, expected=test.expected, wall_s=execution.wall_s
        )


def _compile_failed(failure: TestResult, test: TestCase) -> TestResult:
    return TestResult(
        name=_name(test),
        verdict="compile_error",
        output=failure.output[:STDERR_CHARS],
        expected=test.expected,
    )


def _name(test: TestCase) -> str:
    return test.code if test.code is not None else f"input:\n{test.stdin or ''}"


def _joined(*parts: str) -> str:
    return "\n".join(part for part in parts if part)
