"""``transformers.Trainer`` checkpoints written by the real Trainer, plain and under DeepSpeed ZeRO-3."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from inference.layouts import LayoutSettings, Readiness, get, take_snapshot
from inference.layouts.hf_trainer import state_problem
from tests.cases import hf_trainer, hf_trainer_deepspeed
from tests.checkpoints import LayoutCase
from tests.layout_checks import consolidated_logits, reference_logits, replay_order, run_job

LAYOUT = get("hf_trainer")


@pytest.fixture(scope="module", params=["plain", "zero3"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    build = hf_trainer.build if request.param == "plain" else hf_trainer_deepspeed.build
    return build(tmp_path_factory.mktemp(request.param))


def verdict(directory: Path) -> tuple[Readiness, str]:
    if not directory.is_dir():
        return Readiness.INCOMPLETE, "no folder yet"
    result = LAYOUT.inspect(directory, take_snapshot(directory), LayoutSettings())
    return result.readiness, result.reason


def test_every_saved_checkpoint_is_complete(case: LayoutCase) -> None:
    for name, step in (("checkpoint-4", 4), ("checkpoint-2", 2)):
        directory = case.source / name
        assert LAYOUT.recognise(directory, take_snapshot(directory))
        assert verdict(directory) == (Readiness.COMPLETE, "complete")
        assert LAYOUT.step(directory) == (step, None)


def test_a_slow_writer_is_never_complete_before_trainer_state(case: LayoutCase, tmp_path: Path) -> None:
    assert case.order[-1] == "checkpoint-4/trainer_state.json"
    directory = tmp_path / "run" / case.candidate
    seen = [(step, verdict(directory)[0]) for step in replay_order(case, tmp_path / "run")]
    assert [step for step, readiness in seen[:-1] if readiness is Readiness.COMPLETE] == []
    assert seen[-1][1] is Readiness.COMPLETE


def test_trainer_state_must_name_the_folder_step(case: LayoutCase, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(case.source / case.candidate, tmp_path / "checkpoint-4"))
    state_file = folder / "trainer_state.json"
    text = state_file.read_text()
    state_file.write_text(json.dumps({**json.loads(text), "global_step": 3}))
    assert verdict(folder) == (
        Readiness.INVALID,
        "trainer_state.json says global_step 3, but the folder is checkpoint-4",
    )
    state_file.write_text(text[: len(text) // 2])
    readiness, reason = verdict(folder)
    assert (readiness, reason.split(" (")[0]) == (
        Readiness.INCOMPLETE,
        "trainer_state.json does not parse yet",
    )
    state_file.unlink()
    assert verdict(folder) == (Readiness.INCOMPLETE, "no trainer_state.json yet (the Trainer writes it last)")


def test_materialised_weights_are_the_trained_model(case: LayoutCase, tmp_path: Path) -> None:
    folder = LAYOUT.materialise(case.source / case.candidate, LayoutSettings(), tmp_path)
    assert consolidated_logits(folder).sub(reference_logits(case)).abs().max().item() < 1e-5


def test_the_worker_evaluates_it(case: LayoutCase, tmp_path: Path) -> None:
    result = run_job(case, tmp_path)
    assert result.error is None, result.error
    assert {m.name for m in result.metrics} >= {"accuracy", "response_length"}


@pytest.fixture(scope="module")
def zero3(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    return hf_trainer_deepspeed.build(tmp_path_factory.mktemp("zero3-broken"))


def test_deepspeed_weights_follow_the_deepspeed_rules(zero3: LayoutCase, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(zero3.source / zero3.candidate, tmp_path / "checkpoint-4"))
    assert not (folder / "model.safetensors").exists()
    (folder / "global_step4" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    readiness, reason = verdict(folder)
    assert readiness is Readiness.INCOMPLETE
    assert reason.startswith("global_step4/: zero_pp_rank_1_mp_rank_00_optim_states.pt is missing")
    (folder / "latest").write_text("global_step2")
    assert verdict(folder) == (Readiness.INCOMPLETE, "latest names 'global_step2', which holds no files here")


def test_rules_without_files() -> None:
    assert state_problem(4, '{"global_step": 4}') is None
    problem = state_problem(4, '{"global_step": true}')
    assert problem is not None and problem.reason == "trainer_state.json has no integer global_step"
