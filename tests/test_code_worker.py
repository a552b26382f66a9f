"""A ``kind = "code"`` job end to end: a real worker process, the toy model generating, the sandbox judging.

The toy model answers arithmetic with ``\\boxed{N}`` on one line, so each row's code is its ``prefix``
with the response appended after a ``#``: a comment. The verdicts come from the prefixes alone: one row
passes, one prints a wrong answer, one raises, one does not compile, one spins past its CPU limit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.spec import EXIT_INPUT_ERROR, CodeLimits, CodeSpec, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE
from tests.conftest import ToyRun
from tests.test_worker import job, run_worker

PREFIXES = {
    "right": "print(6)\n#",
    "wrong": "print(5)\n#",
    "raises": "raise ValueError('no')\n#",
    "broken": "print(6\n#",
    "spins": "while True:\n    pass\n#",
}
VERDICTS = {
    "right": "passed",
    "wrong": "wrong_answer",
    "raises": "runtime_error",
    "broken": "compile_error",
    "spins": "timeout",
}


def code_job(checkpoint: Path, tmp_path: Path) -> JobSpec:
    rows = [
        {"id": name, "problem": "What is 2 + 4?", "prefix": prefix, "tests": [{"input": "", "output": "6\n"}]}
        for name, prefix in PREFIXES.items()
    ]
    dataset = tmp_path / "code.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    spec = job(checkpoint, dataset, tmp_path)
    task = TaskSpec(
        name="toy-code",
        kind="code",
        dataset=dataset,
        prompt_template=PROMPT_TEMPLATE,
        id_field="id",
        batch_size=8,
        code=CodeSpec(
            extract="append",
            prefix_field="prefix",
            parallel=2,
            limits=CodeLimits(cpu_s=1, wall_s=5, memory_mb=256),
        ),
        metrics=("pass@1", "test_pass_rate", "wrong_answer_rate", "timeout_rate", "compile_error_rate"),
    )
    return spec.model_copy(update={"task": task})


def test_a_code_job_runs_the_models_code_in_the_sandbox(toy_run: ToyRun, tmp_path: Path) -> None:
    done, result = run_worker(code_job(toy_run.last_checkpoint, tmp_path), tmp_path)

    assert done.returncode == 0, done.stderr
    assert result.error is None
    responses = {s.prompt_id: s.response for s in result.samples}
    assert all("\n" not in response for response in responses.values()), responses
    by_id = {sample.prompt_id: sample for sample in result.samples}
    assert {name: by_id[name].verdict for name in PREFIXES} == VERDICTS
    wrong = by_id["wrong"]
    assert (wrong.failed_test, wrong.failed_output) == ("input:\n\nexpected:\n6\n", "5\n")
    assert (wrong.tests_passed, wrong.tests_total, wrong.verdicts) == (0, 1, {"wrong_answer": 1})
    assert by_id["right"].correct and by_id["right"].extracted == "print(6)\n#" + responses["right"]
    assert "ValueError: no" in (by_id["raises"].failed_output or "")
    metrics = {m.name: m.value for m in result.metrics}
    assert metrics == pytest.approx(
        {
            "pass@1": 0.2,
            "test_pass_rate": 0.2,
            "wrong_answer_rate": 0.2,
            "timeout_rate": 0.2,
            "compile_error_rate": 0.2,
        }
    )
    assert result.timing is not None and result.timing.grading_s > 0


def test_a_code_job_without_a_sandbox_fails_before_loading(tmp_path: Path) -> None:
    spec = code_job(tmp_path / "no-checkpoint", tmp_path)
    assert spec.task.code is not None
    task = spec.task.model_copy(update={"code": spec.task.code.model_copy(update={"language": "cobol"})})
    done, result = run_worker(spec.model_copy(update={"task": task}), tmp_path)
    assert done.returncode == EXIT_INPUT_ERROR
    assert result.error is not None
    assert result.error.kind == "task_invalid"
    assert result.error.message == "task 'toy-code': unknown language 'cobol' (known: cpp, python)"
