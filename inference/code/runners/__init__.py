"""Language runners: ``language`` name → runner. Add a language with one file and one entry here."""

from __future__ import annotations

from inference.code.runners.base import Program, Runner
from inference.code.runners.cpp import CppRunner
from inference.code.runners.python import PythonRunner
from inference.code.sandbox import Limits
from inference.errors import TaskInvalid

RUNNERS: dict[str, type[Runner]] = {runner.name: runner for runner in (PythonRunner, CppRunner)}


def runner_for(
    language: str, executable: str | None = None, *, compile_limits: Limits | None = None
) -> Runner:
    """The runner of ``language``; an unknown one is :class:`TaskInvalid` listing the known ones."""
    if language not in RUNNERS:
        raise TaskInvalid(f"unknown language {language!r} (known: {', '.join(sorted(RUNNERS))})")
    return RUNNERS[language](executable, compile_limits=compile_limits)


__all__ = ["RUNNERS", "Program", "Runner", "runner_for"]
