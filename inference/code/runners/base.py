"""What a language runner is: code and a test in, the files and command the sandbox runs out.

A runner prepares a sample's code once (a compiled language compiles it, in the sandbox, and a failed
compilation is the sample's verdict for every test), then gives the program for each test. It reads an
execution back as a verdict, since what a crash looks like depends on the language.
"""

from __future__ import annotations

import secrets
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from inference.code.grading import TestResult, Verdict, limit_verdict, same_output
from inference.code.problems import TestCase
from inference.code.sandbox import SYSTEM_PATH, Channel, Execution, Limits, Sandbox, SandboxFile
from inference.errors import TaskInvalid

#: What a verdict rests on, said beside the program's output when it is not a plain one.
Judged = tuple[Verdict, str]
EARLY_EXIT = "(exited with status 0 before its tests returned: no report from the harness)"
FORGED = "(interfered: the harness's report descriptor holds what the harness did not write)"


@dataclass(frozen=True)
class Program:
    """What the sandbox runs: files (under ``{files}``) and a command line."""

    files: tuple[SandboxFile, ...]
    argv: tuple[str, ...]
    #: A harnessed program's hidden input (the nonce and its tests), on a descriptor, never in a file.
    channel: Channel | None = None
    #: The nonce the harness's report must carry for a pass: sent only in ``channel``, which the harness
    #: reads and closes before the program's code runs.
    nonce: str | None = None


class Runner(ABC):
    #: The ``language`` a task names.
    name: ClassVar[str]
    #: The interpreter or compiler looked up on the system ``PATH`` when the task names none.
    default_executable: ClassVar[str]
    #: Whether it runs assert tests (code appended to the solution) as well as stdin/stdout ones.
    runs_asserts: ClassVar[bool] = False
    #: Fenced-block tags that mark this language's code (an untagged block counts too).
    tags: ClassVar[tuple[str, ...]]

    def __init__(self, executable: str | None = None, *, compile_limits: Limits | None = None) -> None:
        self.compile_limits = compile_limits
        wanted = executable or self.default_executable
        found = shutil.which(wanted, path=SYSTEM_PATH)
        if found is None:
            raise TaskInvalid(
                f"language {self.name!r}: {wanted} is not installed (looked in {SYSTEM_PATH}); install "
                f"it, or set executable to its path"
            )
        self.executable = Path(found).resolve()

    @property
    def readable(self) -> tuple[Path, ...]:
        """Host folders the sandbox must show: the toolchain's prefix when it is not under /usr."""
        if self.executable.is_relative_to("/usr"):
            return ()
        return (self.executable.parent.parent,)

    @abstractmethod
    def prepare(self, code: str, sandbox: Sandbox) -> Program | TestResult:
        """The program the tests run, or the ``compile_error`` every test of the sample gets."""

    @abstractmethod
    def program(self, prepared: Program, test: TestCase, setup: str) -> Program:
        """The program for one test (``setup``: code an assert test needs first)."""

    @abstractmethod
    def crash_verdict(self, execution: Execution, test: TestCase) -> Verdict:
        """The verdict of a failed run (non-zero exit), limits aside."""

    def verdict(self, execution: Execution, test: TestCase, program: Program, limits: Limits) -> Judged:
        """The verdict, and what it rests on when that is not the program's own output."""
        if program.nonce is not None:
            harnessed = harness_verdict(execution, program.nonce)
            if harnessed is not None:
                return harnessed
        limit = limit_verdict(execution.returncode, execution.timed_out, execution.wall_s, limits.cpu_s)
        if limit is not None:
            return limit, ""
        if execution.returncode != 0:
            return self.crash_verdict(execution, test), ""
        if program.nonce is not None:
            return "runtime_error", EARLY_EXIT
        if test.expected is None:
            return "passed", ""
        stdout = execution.stdout.decode("utf-8", "replace")
        same = same_output(stdout, test.expected, test.compare, test.tolerance)
        return ("passed" if same else "wrong_answer"), ""


def harness_verdict(execution: Execution, nonce: str) -> Judged | None:
    """What the harness's report says: ``passed`` only for exactly its record, with ``nonce``, and exit
    status 0; ``interfered`` for a record listing interference, or a report it did not write; ``None``
    (the exit decides) when there is no report at all."""
    if not execution.report:
        return None
    lines = execution.report.decode("utf-8", "replace").split("\n")
    if lines[-1] != "" or not secrets.compare_digest(lines[0], nonce):
        return "interfered", FORGED
    found = [line for line in lines[1:-1] if line]
    if found:
        return "interfered", "(interfered: " + "; ".join(found)[:1000] + ")"
    if execution.returncode != 0 or execution.timed_out:
        return None
    return "passed", ""


def compile_limits(limits: Limits, seconds: float, memory_mb: int) -> Limits:
    """A compiler's limits: its own time and memory, room for its temporary files and the binary."""
    return Limits(
        cpu_s=seconds,
        wall_s=seconds * 2,
        memory_mb=memory_mb,
        processes=max(limits.processes, 16),
        file_mb=max(limits.file_mb, 128),
        open_files=max(limits.open_files, 256),
        tmp_mb=max(limits.tmp_mb, 512),
    )
