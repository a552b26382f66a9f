from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from inference import loader
from inference.dataset import load_dataset
from inference.errors import CheckpointInvalid, CheckpointVanished, TaskInvalid
from inference.excerpt import CUT_MARKER, cut_text
from inference.loader import load_model
from inference.spec import EXIT_INPUT_ERROR, InferenceSpec, JobResult, JobSpec, Problem, TaskSpec
from inference.task import render_prompts
from inference.toy.problems import PROMPT_TEMPLATE
from inference.worker import run
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import patient
from tests.forkserver import worker_python

METRICS = ("accuracy", "response_length", "truncation_rate", "tokens_per_s", "wall_s", "load_s")


def job(checkpoint: Path, dataset: Path, tmp_path: Path, metrics: tuple[str, ...] = METRICS) -> JobSpec:
    return JobSpec(
        job_id=11,
        checkpoint_path=checkpoint,
        result_path=tmp_path / "result.json",
        task=TaskSpec(
            name="toy",
            dataset=dataset,
            prompt_template=PROMPT_TEMPLATE,
            id_field="id",
            batch_size=8,
            metrics=metrics,
        ),
        inference=InferenceSpec(threads=1),
        max_samples=5,
    )


def run_worker(spec: JobSpec, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], JobResult]:
    """``python -m inference.worker``, forked from the session's preloaded interpreter where it can be
    (tests/forkserver.py)."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
    done = subprocess.run(
        [worker_python(), "-m", "inference.worker", str(spec_path)],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=patient(120),
    )
    return done, JobResult.read(spec.result_path)


def copy_checkpoint(toy_run: ToyRun, tmp_path: Path) -> Path:
    return Path(shutil.copytree(toy_run.last_checkpoint, tmp_path / "checkpoint"))


def test_worker_evaluates_a_checkpoint(toy_run: ToyRun, toy_dataset: Path, tmp_path: Path) -> None:
    # Forked from the session's preloaded interpreter; a fresh one gives the same result
    # (test_forkserver.py), and make test-long starts every worker fresh.
    done, result = run_worker(job(toy_run.last_checkpoint, toy_dataset, tmp_path), tmp_path)

    assert done.returncode == 0, done.stderr
    assert result.error is None
    metrics = {m.name: m for m in result.metrics}
    assert tuple(metrics) == METRICS
    accuracy = metrics["accuracy"]
    assert accuracy.n == 20
    hits = round(accuracy.value * 20)
    assert accuracy.stderr == pytest.approx(math.sqrt((hits + 2) / 24 * (22 - hits) / 24 / 24))
    assert metrics["response_length"].n == 20
    assert metrics["response_length"].value > 5  # "\boxed{…}" alone is 8 characters
    assert metrics["response_length"].stderr is not None
    assert metrics["tokens_per_s"].value > 0
    assert (metrics["tokens_per_s"].n, metrics["tokens_per_s"].stderr) == (20, None)
    assert (metrics["wall_s"].n, metrics["wall_s"].stderr) == (None, None)
    assert result.timing is not None
    assert 0 < result.timing.load_s < result.timing.total_s
    assert metrics["wall_s"].value == pytest.approx(result.timing.total_s)

    assert [s.index for s in result.samples] == [0, 1, 2, 3, 4]
    first_row = json.loads(toy_dataset.read_text(encoding="utf-8").splitlines()[0])
    sample = result.samples[0]
    assert (sample.prompt_id, sample.prompt, sample.reference) == (
        first_row["id"],
        first_row["problem"] + "=",
        first_row["answer"],
    )
    assert sample.response.startswith("\\boxed{")
    assert sample.extracted is not None
    assert sum(bool(s.correct) for s in result.samples) <= round(accuracy.value * 20)

    events = [json.loads(line)["event"] for line in done.stderr.splitlines() if line.startswith("{")]
    assert events[0] == "worker.started"
    assert events[-1] == "worker.finished"


def test_invalid_config_json(toy_run: ToyRun, toy_dataset: Path, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(toy_run, tmp_path)
    (checkpoint / "config.json").write_text('{"model_type": "llama",', encoding="utf-8")

    done, result = run_worker(job(checkpoint, toy_dataset, tmp_path), tmp_path)

    assert done.returncode == EXIT_INPUT_ERROR
    assert result.error is not None
    assert result.error.kind == "checkpoint_invalid"
    assert f"{checkpoint}: config.json is not valid JSON" in result.error.message
    assert result.metrics == ()
    assert done.stderr.splitlines()[-1].startswith("evald worker: checkpoint_invalid: ")


def test_truncated_weights(toy_run: ToyRun, toy_dataset: Path, tmp_path: Path) -> None:
    checkpoint = copy_checkpoint(toy_run, tmp_path)
    weights = checkpoint / "model.safetensors"
    with weights.open("r+b") as file:
        file.truncate(weights.stat().st_size // 2)

    done, result = run_worker(job(checkpoint, toy_dataset, tmp_path), tmp_path)

    assert done.returncode == EXIT_INPUT_ERROR
    assert result.error is not None
    assert result.error.kind == "checkpoint_invalid"
    assert f"{checkpoint}: model.safetensors: truncated" in result.error.message


def test_a_bad_dataset_line_is_reported_and_the_rest_evaluated(
    toy_run: ToyRun, toy_dataset: Path, tmp_path: Path
) -> None:
    lines = toy_dataset.read_text(encoding="utf-8").splitlines()
    lines[2] = '{"id": "x", "problem": "1+1"}'
    toy_dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")

    done, result = run_worker(job(toy_run.last_checkpoint, toy_dataset, tmp_path), tmp_path)

    assert done.returncode == 0, done.stderr
    assert result.problems == (Problem(where=f"{toy_dataset}:3", message="missing field 'answer'"),)
    assert {m.name: m.n for m in result.metrics}["accuracy"] == 19


def test_a_dataset_without_a_good_line_fails_the_job(toy_dataset: Path, tmp_path: Path) -> None:
    toy_dataset.write_text('{"id": "x", "problem": "1+1"}\n[]\n', encoding="utf-8")

    result, code = run(job(tmp_path / "no-such-checkpoint", toy_dataset, tmp_path), 0)

    assert code == EXIT_INPUT_ERROR
    assert result is not None and result.error is not None
    assert result.error.kind == "dataset_invalid"
    assert result.error.message == (
        f"{toy_dataset}: no usable rows, all 2 are bad: {toy_dataset}:1: missing field 'answer'; "
        f"{toy_dataset}:2: expected a JSON object, got list"
    )


def test_unknown_metric_is_rejected_before_loading(toy_dataset: Path, tmp_path: Path) -> None:
    spec = job(tmp_path / "no-such-checkpoint", toy_dataset, tmp_path, metrics=("accuracy", "rouge"))

    result, code = run(spec, 0)

    assert code == EXIT_INPUT_ERROR
    assert result is not None
    assert result.error is not None
    assert result.error.kind == "task_invalid"
    assert "unknown metric 'rouge'" in result.error.message


def test_vanished_checkpoint(toy_dataset: Path, tmp_path: Path) -> None:
    result, code = run(job(tmp_path / "step_9", toy_dataset, tmp_path), 0)

    assert code == EXIT_INPUT_ERROR
    assert result is not None
    assert result.error is not None
    assert result.error.kind == "checkpoint_vanished"
    assert str(tmp_path / "step_9") in result.error.message


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda c: (c / "model.safetensors").unlink(),
            r"no weights \(model\.safetensors, model\.safetensors\.index\.json, pytorch_model\.bin or ",
        ),
        (lambda c: (c / "config.json").unlink(), r"no config\.json"),
        (
            lambda c: (c / "config.json").write_text("[]", encoding="utf-8"),
            r"config\.json is not a JSON object",
        ),
        (lambda c: (c / "tokenizer.json").unlink(), r"cannot load the tokenizer"),
        (
            lambda c: (c / "model.safetensors").write_bytes(
                b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}!!"
            ),
            r"model\.safetensors: header is not JSON",
        ),
    ],
)
def test_broken_checkpoints_are_named(
    toy_run: ToyRun, tmp_path: Path, damage: Callable[[Path], object], message: str
) -> None:
    checkpoint = copy_checkpoint(toy_run, tmp_path)
    damage(checkpoint)

    with pytest.raises(CheckpointInvalid, match=message):
        load_model(checkpoint, InferenceSpec())


def test_checkpoint_rotated_away_while_loading_is_vanished(
    toy_run: ToyRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = copy_checkpoint(toy_run, tmp_path)
    check = loader.check_checkpoint

    def check_then_rotate(directory: Path) -> None:
        # The race a trainer's rotation causes: complete when checked, gone when transformers reads it.
        check(directory)
        shutil.rmtree(directory)

    monkeypatch.setattr(loader, "check_checkpoint", check_then_rotate)

    with pytest.raises(CheckpointVanished, match="disappeared while loading"):
        load_model(checkpoint, InferenceSpec())


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("Q: {prompt} {x}", r"needs exactly the placeholder \{prompt\}, has \['prompt', 'x'\]"),
        ("Q:", r"needs exactly the placeholder \{prompt\}, has \[\]"),
        ("{{prompt}}", r"needs exactly the placeholder \{prompt\}, has \[\]"),
        ("{prompt} }", r"Single '\}' encountered"),
        ("{prompt:d}", r"does not format"),
        ("{prompt[0]}", r"needs exactly the placeholder \{prompt\}, has \['prompt\[0\]'\]"),
    ],
)
def test_prompt_template_must_format(toy_dataset: Path, template: str, message: str) -> None:
    items = load_dataset(toy_dataset, limit=1)
    task = TaskSpec(name="t", dataset=toy_dataset, prompt_template=template)

    with pytest.raises(TaskInvalid, match=rf"task 't': prompt_template .*: {message}"):
        render_prompts(task, items)


def test_prompt_template_applies(toy_dataset: Path) -> None:
    items = load_dataset(toy_dataset, limit=2)
    task = TaskSpec(name="t", dataset=toy_dataset, prompt_template="Q: {prompt} = {{?}}")

    assert render_prompts(task, items) == [f"Q: {item.prompt} = {{?}}" for item in items]


def test_cut_text_marks_what_it_cut() -> None:
    assert cut_text("short", 16) == "short"
    cut = cut_text("x" * 100, 16)
    assert len(cut) == 16
    assert cut.endswith(CUT_MARKER)


def test_a_worker_imports_deepspeed_without_mlflow() -> None:
    # mlflow is installed beside evald (the tracker tests need it), so DeepSpeed's autotuner would import
    # it: in a worker, after skip_mlflow, it finds none and mlflow's modules are never loaded.
    probe = (
        "import importlib.util, json, sys\n"
        "installed = importlib.util.find_spec('mlflow') is not None\n"
        "from inference.worker import skip_mlflow\n"
        "skip_mlflow()\n"
        "import deepspeed.autotuning.autotuner as tuner\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('mlflow.'))\n"
        "print(json.dumps([installed, tuner.has_mlflow, loaded]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**SUBPROCESS_ENV, "DS_ACCELERATOR": "cpu"},
        capture_output=True,
        text=True,
        timeout=patient(120),
        check=True,
    )
    installed, has_mlflow, loaded = json.loads(done.stdout.splitlines()[-1])
    assert installed, "mlflow is not installed here: this test checks nothing"
    assert has_mlflow is False
    assert loaded == []
