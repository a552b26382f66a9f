"""lm-eval's code tasks (humaneval, mbpp) judged in evald's sandbox instead of ``code_eval``'s ``exec``.

lm-eval's task utils call ``evaluate.load("code_eval")`` when they are imported, then
``.compute(references=..., predictions=..., k=[...])``. Within :func:`sandboxed_code_eval` that load
returns a :class:`SandboxedCodeEval`: each ``candidate + "\\n" + reference`` (the very program
``code_eval`` would ``exec`` in a forked process) runs as a Python program in the sandbox, with the task's
limits, and pass@k is the same unbiased estimator. ``HF_ALLOW_CODE_EVAL`` is neither needed nor read, and
the Hub's ``code_eval`` script is never fetched.

``evaluate`` takes seconds to import, so it is not imported here: an import hook wraps its ``load`` when
something (a code task's utils) first imports it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from inference.code.judge import Judge
from inference.code.problems import CodeProblem, TestCase
from inference.spec import CodeSpec

#: What ``code_eval``'s ``compute`` returns: pass@k by name, and each task's ``(completion_id, result)``.
Computed = tuple[dict[str, float], dict[int, list[tuple[int, dict[str, Any]]]]]


class SandboxedCodeEval:
    """``code_eval``'s ``compute``, run in the sandbox."""

    def __init__(self, judge: Judge) -> None:
        self.judge = judge

    def compute(
        self,
        *,
        references: Sequence[str],
        predictions: Sequence[Sequence[str]],
        k: Sequence[int] = (1, 10, 100),
        num_workers: int = 4,
        timeout: float = 3.0,
    ) -> Computed:
        # num_workers and timeout are code_eval's; the task's parallel and limits apply instead.
        problems = [
            CodeProblem(
                prompt_id=str(task), prefix="", setup="", tests=(TestCase("reference", code=reference),)
            )
            for task, reference in enumerate(references)
        ]
        submissions = [
            (problem, candidate)
            for problem, candidates in zip(problems, predictions, strict=True)
            for candidate in candidates
        ]
        judged = iter(self.judge.judge(submissions))
        results: dict[int, list[tuple[int, dict[str, Any]]]] = {}
        for task, candidates in enumerate(predictions):
            for number in range(len(candidates)):
                result = next(judged)
                outcome = "passed" if result.passed else f"failed: {result.verdict}"
                results.setdefault(task, []).append(
                    (
                        number,
                        {
                            "task_id": task,
                            "passed": result.passed,
                            "result": outcome,
                            "completion_id": number,
                        },
                    )
                )
        totals = [len(candidates) for candidates in predictions]
        correct = [sum(r["passed"] for _, r in results.get(task, [])) for task in range(len(predictions))]
        scores = {
            f"pass@{size}": sum(pass_at_k(n, c, size) for n, c in zip(totals, correct, strict=True))
            / len(totals)
            for size in k
            if totals and all(n >= size for n in totals)
        }
        return scores, results


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k, ``1 - C(n - c, k) / C(n, k)``, in exact integers. (Not
    :func:`inference.metrics.passk.pass_at_k`: importing the metrics here would close an import circle,
    metrics → harness → code.)"""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@contextmanager
def sandboxed_code_eval(task_name: str, spec: CodeSpec) -> Iterator[None]:
    """While active, ``evaluate.load("code_eval")`` is :class:`SandboxedCodeEval` (Python, the program as
    given); the sandbox is checked on the first such load, so a task without code pays nothing."""
    spec = spec.model_copy(update={"language": "python", "extract": "append"})
    judges: list[Judge] = []

    def code_eval() -> SandboxedCodeEval:
        if not judges:
            judge = Judge(task_name, spec)
            judge.check()
            judges.append(judge)
        return SandboxedCodeEval(judges[0])

    hook = _EvaluateHook(code_eval)
    module = sys.modules.get("evaluate")
    if module is not None:
        hook.wrap(module)
    sys.meta_path.insert(0, hook)
    try:
        yield
    finally:
        sys.meta_path.remove(hook)
        hook.unwrap()


class _EvaluateHook(importlib.abc.MetaPathFinder):
    """Wraps ``evaluate.load`` once the ``evaluate`` module is imported (and unwraps it at the end)."""

    def __init__(self, code_eval: Callable[[], SandboxedCodeEval]) -> None:
        self.code_eval = code_eval
        self.wrapped: tuple[ModuleType, Callable[..., Any]] | None = None

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "evaluate" or self.wrapped is not None:
            return None
        # The real finder finds it; only its loading is wrapped, to patch the module once it has run.
        sys.meta_path.remove(self)
        try:
            found = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            sys.meta_path.insert(0, self)
        if found is None or found.loader is None:
            return None
        loader = found.loader
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            self.wrap(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return found

    def wrap(self, module: ModuleType) -> None:
        load: Callable[..., Any] = getattr(module, "load")  # noqa: B009 (typed as a plain module)
        code_eval = self.code_eval

        def sandboxed_load(path: str, *args: Any, **kwargs: Any) -> Any:
            if path == "code_eval":
                return code_eval()
            return load(path, *args, **kwargs)

        setattr(module, "load", sandboxed_load)  # noqa: B010
        self.wrapped = (module, load)

    def unwrap(self) -> None:
        if self.wrapped is not None:
            module, load = self.wrapped
            setattr(module, "load", load)  # noqa: B010
