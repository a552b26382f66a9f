"""One bad sample never sinks a job: 1,000 rows, five of them poisoned, through the real worker process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from inference.spec import InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, plain_row
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import Deadline, patient
from tests.forkserver import worker_python

METRICS = (
    "accuracy",
    "exact_match",
    "reward",
    "entropy",
    "response_length_correct",
    "response_length_incorrect",
    "truncation_rate",
    "latency_p50_s",
    "peak_memory_mb",
)


def poisoned_dataset(path: Path) -> dict[int, str]:
    """995 good rows and five poisoned ones, by line number: two bad rows, three that break the reward."""
    lines = [
        json.dumps(plain_row(problem, index)) for index, problem in enumerate(held_out_problems(997, seed=5))
    ]
    poison = {
        100: json.dumps({"id": "no-answer", "problem": "1+2"}),
        300: json.dumps({"id": "empty", "problem": "   ", "answer": "0"}),
        500: json.dumps({"id": "raises", "problem": "raise 1+2", "answer": "3"}),
        700: json.dumps({"id": "hangs", "problem": "hang 1+2", "answer": "3"}),
        900: json.dumps({"id": "text", "problem": "text 1+2", "answer": "3"}),
    }
    for number in sorted(poison):
        lines.insert(number - 1, poison[number])
    del lines[1000:]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {number: json.loads(poison[number])["id"] for number in poison}


@pytest.mark.long
def test_a_job_with_five_poisoned_rows_grades_the_other_995(toy_run: ToyRun, tmp_path: Path) -> None:
    dataset = tmp_path / "poisoned.jsonl"
    poison = poisoned_dataset(dataset)
    assert len(dataset.read_text(encoding="utf-8").splitlines()) == 1000
    spec = JobSpec(
        job_id=5,
        checkpoint_path=toy_run.last_checkpoint,
        result_path=tmp_path / "result.json",
        task=TaskSpec(
            name="poisoned",
            dataset=dataset,
            id_field="id",
            prompt_template=PROMPT_TEMPLATE,
            max_new_tokens=12,
            batch_size=100,
            reward="tests.reward_fns:poisoned",
            reward_timeout_s=2.0,
            metrics=METRICS,
        ),
        inference=InferenceSpec(threads=2),
        max_samples=50,
    )
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
    bound = Deadline(240)
    done = subprocess.run(
        [worker_python(), "-m", "inference.worker", str(spec_path)],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=patient(300),
    )
    late, elapsed = bound.expired(), bound.waited()

    assert done.returncode == 0, done.stderr[-3000:]
    result = JobResult.read(spec.result_path)
    metrics = {m.name: m for m in result.metrics}
    for name in ("accuracy", "exact_match", "reward", "entropy", "truncation_rate"):
        assert metrics[name].n == 995, name
    # A side with no answers is absent (never a mean of 0 over n = 0); together they count every sample.
    split = [metrics[m] for m in ("response_length_correct", "response_length_incorrect") if m in metrics]
    assert sum(m.n or 0 for m in split) == 995 and all(m.n for m in split)
    assert [(p.where, p.prompt_id) for p in result.problems] == [
        (f"{dataset}:100", None),
        (f"{dataset}:300", None),
        ("sample 497", "raises"),
        ("sample 697", "hangs"),
        ("sample 897", "text"),
    ]
    messages = [p.message for p in result.problems]
    assert messages[0] == "missing field 'answer'"
    assert messages[1] == "empty field 'problem'"
    assert messages[2] == "reward raised ValueError: cannot score 'raise 1+2'"
    assert messages[3] == "reward took longer than 2 s (reward_timeout_s) and was stopped"
    assert messages[4] == "reward returned str 'high', not a number"
    assert set(poison.values()) == {"no-answer", "empty", "raises", "hangs", "text"}
    # 50 kept by the cap, and the three failed samples beyond it.
    assert len(result.samples) == 53
    assert [s.error is not None for s in result.samples].count(True) == 3
    # The hang cost its time limit once, not the job.
    # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
    assert not late, f"took {elapsed:.1f} s"
