"""Judging a job's code samples: extraction, preparation (compilation) and every test, in parallel.

Executions wait on sandboxed processes, so a pool of ``parallel`` threads keeps that many running at once;
the worker holds no lock meanwhile. Samples can be handed in while others are still being judged (a job
hands in each batch as soon as it is generated, see :mod:`inference.code.stream`). Each distinct program
is prepared (compiled) once, and each distinct (program, test) run once, across everything handed in:
with sampling, identical completions are common.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

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
        with JudgingPool(self) as pool:
            handed_in = [pool.submit(problem, response) for problem, response in submissions]
            return [future.result() for future in handed_in]

    def _prepare(self, code: str) -> Program | TestResult:
        return self.runner.prepare(code, self.sandbox)

    def _run(self, prepared: Program, problem: CodeProblem, test: TestCase) -> TestResult:
        program = self.runner.program(prepared, test, problem.setup)
        stdin = (test.stdin or "").encode()
        execution = self.sandbox.run(program.argv, program.files, stdin, self.limits, program.channel)
        verdict, note = self.runner.verdict(execution, test, program, self.limits)
        output = ""
        if verdict != "passed":
            stdout = execution.stdout.decode("utf-8", "replace")
            stderr = execution.stderr.decode("utf-8", "replace")
            output = _joined(stdout[:STDOUT_CHARS], stderr[-STDERR_CHARS:], note)
            if verdict == "timeout":
                output = _joined(output, f"(stopped by the time limit after {execution.wall_s:.1f} s)")
        return TestResult(
            name=_name(test), verdict=verdict, output=output, expected=test.expected, wall_s=execution.wall_s
        )


class JudgingPool:
    """A judge's ``parallel`` threads, taking submissions at any time: each comes back as a future of its
    result. A submission's program is prepared, then its tests are queued; nothing waits inside the pool.
    Close it (or leave its ``with``) once every future is done: an early close cancels what is queued."""

    def __init__(self, judge: Judge) -> None:
        self._judge = judge
        self._pool = ThreadPoolExecutor(judge.spec.parallel, thread_name_prefix="evald-code")
        # Held briefly, by the submitting thread and by pool threads queueing tests.
        self._lock = threading.Lock()
        self._prepared: dict[str, Future[Program | TestResult]] = {}
        self._runs: dict[tuple[str, str, int], Future[TestResult]] = {}

    def __enter__(self) -> JudgingPool:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(cancel=kind is not None)

    def close(self, *, cancel: bool = False) -> None:
        """Wait for the executions under way; ``cancel`` drops those not started (their futures fail)."""
        self._pool.shutdown(wait=True, cancel_futures=cancel)

    def submit(self, problem: CodeProblem, response: str) -> Future[SampleResult]:
        code = self._judge.code_of(problem, response)
        result: Future[SampleResult] = Future()
        try:
            with self._lock:
                prepared = self._prepared.get(code)
                if prepared is None:
                    prepared = self._prepared[code] = self._pool.submit(self._judge._prepare, code)
        except RuntimeError as exc:  # closed
            result.set_exception(exc)
            return result
        prepared.add_done_callback(lambda done: self._queue_tests(done, code, problem, result))
        return result

    def _queue_tests(
        self,
        prepared: Future[Program | TestResult],
        code: str,
        problem: CodeProblem,
        result: Future[SampleResult],
    ) -> None:
        # Runs in the pool thread that prepared the program (or the submitter's, if it was ready): it
        # must queue and return, never wait.
        try:
            program = prepared.result()
            if not isinstance(program, Program):
                failed = tuple(_compile_failed(program, test) for test in problem.tests)
                result.set_result(SampleResult(code=code, tests=failed))
                return
            runs = []
            with self._lock:
                for number, test in enumerate(problem.tests):
                    key = (code, problem.prompt_id, number)
                    run = self._runs.get(key)
                    if run is None:
                        run = self._runs[key] = self._pool.submit(self._judge._run, program, problem, test)
                    runs.append(run)
        except Exception as exc:  # a failed preparation, a cancelled one, or a closed pool
            result.set_exception(exc)
            return
        when_all(runs, lambda: _collect(code, runs, result))


def when_all(futures: Sequence[Future[Any]], then: Callable[[], None]) -> None:
    """Call ``then`` once every one of ``futures`` is done (at once if there are none), in the thread
    that finished the last."""
    if not futures:
        then()
        return
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future[Any]) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    for future in futures:
        future.add_done_callback(one_done)


def _collect(code: str, runs: Sequence[Future[TestResult]], result: Future[SampleResult]) -> None:
    try:
        tests = tuple(run.result() for run in runs)
    except Exception as exc:
        result.set_exception(exc)
        return
    result.set_result(SampleResult(code=code, tests=tests))


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
