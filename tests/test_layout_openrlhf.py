"""OpenRLHF checkpoints as OpenRLHF saves them: the actor's engine folders and the ``_hf`` folders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inference import layouts
from inference.errors import CheckpointInvalid
from inference.layouts import LayoutSettings, Readiness, get, take_snapshot
from inference.layouts.openrlhf import tokenizer_problem
from tests.cases import openrlhf, openrlhf_hf
from tests.checkpoints import LayoutCase
from tests.layout_checks import consolidated_logits, reference_logits, replay_order, run_job

LAYOUT = get("openrlhf")


@pytest.fixture(scope="module")
def actor(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    return openrlhf.build(tmp_path_factory.mktemp("actor"))


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    return openrlhf_hf.build(tmp_path_factory.mktemp("hf"))


def verdict(directory: Path) -> tuple[Readiness, str]:
    if not directory.is_dir():
        return Readiness.INCOMPLETE, "no folder yet"
    result = LAYOUT.inspect(directory, take_snapshot(directory), LayoutSettings())
    return result.readiness, result.reason


@pytest.mark.parametrize(
    "name", ["_actor/global_step2", "_actor/global_step1", "global_step2_hf", "global_step1_hf"]
)
def test_saved_folders_are_recognised_complete_and_stepped(actor: LayoutCase, name: str) -> None:
    directory = actor.source / name
    snapshot = take_snapshot(directory)
    assert layouts.detect(directory, snapshot, "auto") == "openrlhf"
    assert verdict(directory) == (Readiness.COMPLETE, "complete")
    assert LAYOUT.step(directory) == (int(name.split("global_step")[1][0]), None)


def test_slow_writers_are_never_complete_early(
    actor: LayoutCase, hf_folder: LayoutCase, tmp_path: Path
) -> None:
    for case in (actor, hf_folder):
        directory = tmp_path / case.layout / case.candidate
        seen = [(step, verdict(directory)[0]) for step in replay_order(case, tmp_path / case.layout)]
        assert [step for step, readiness in seen[:-1] if readiness is Readiness.COMPLETE] == [], (
            case.candidate
        )
        assert seen[-1][1] is Readiness.COMPLETE
        shutil.rmtree(tmp_path / case.layout)


def test_config_rewritten_after_the_weights_is_not_read(hf_folder: LayoutCase, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(hf_folder.source / hf_folder.candidate, tmp_path / "global_step2_hf"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    (folder / "config.json").write_text('{"archi')  # save_model's to_json_file, half-way
    assert verdict(folder) == (
        Readiness.INCOMPLETE,
        "no tokenizer_config.json yet (OpenRLHF saves the tokenizer last)",
    )


def test_the_actor_is_consolidated_with_the_config_saved_beside_it(actor: LayoutCase, tmp_path: Path) -> None:
    folder = LAYOUT.materialise(actor.source / actor.candidate, LayoutSettings(), tmp_path)
    assert consolidated_logits(folder).sub(reference_logits(actor)).abs().max().item() < 1e-5


def test_without_an_hf_folder_or_hf_config_the_fix_is_named(actor: LayoutCase, tmp_path: Path) -> None:
    run = Path(shutil.copytree(actor.source, tmp_path / "ckpt"))
    shutil.rmtree(run / "global_step2_hf")
    with pytest.raises(
        CheckpointInvalid, match=r"global_step2_hf/ has no config\.json; set runs\[\]\.hf_config"
    ):
        LAYOUT.materialise(run / "_actor" / "global_step2", LayoutSettings(), tmp_path / "scratch")


def test_critic_and_ema_folders_are_not_taken_for_the_policy(actor: LayoutCase, tmp_path: Path) -> None:
    critic = Path(shutil.copytree(actor.source / "_actor", tmp_path / "ckpt" / "_critic")) / "global_step2"
    assert layouts.detect(critic, take_snapshot(critic), "auto") == "openrlhf"
    assert verdict(critic) == (
        Readiness.INVALID,
        "OpenRLHF _critic state, not the policy: its weights are in _actor/global_step2 and global_step2_hf",
    )
    with pytest.raises(CheckpointInvalid, match="_critic state is not the policy"):
        LAYOUT.materialise(critic, LayoutSettings(), tmp_path)


@pytest.mark.parametrize("which", ["actor", "hf"])
def test_the_worker_evaluates_both_folders(
    actor: LayoutCase, hf_folder: LayoutCase, which: str, tmp_path: Path
) -> None:
    case = actor if which == "actor" else hf_folder
    result = run_job(case, tmp_path, hf_config=None)  # the actor borrows global_step2_hf's config
    assert result.error is None, result.error
    assert {m.name for m in result.metrics} >= {"accuracy", "response_length"}


def test_tokenizer_rule_without_files() -> None:
    assert tokenizer_problem('{"backend": "tokenizers"}', '{"model": {}}') is None
    assert tokenizer_problem('{"backend": "sentencepiece"}', None) is None
    assert tokenizer_problem('{"backend": "tokenizers"}', '{"mod') is not None
    assert tokenizer_problem("{", None) is not None
