"""DeepSpeed engine checkpoints written by the real engine (2 ranks, gloo, CPU): readiness, consolidation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from inference.errors import CheckpointInvalid
from inference.layouts import LayoutSettings, Readiness, get, take_snapshot
from inference.layouts.deepspeed import commit_problem, expected_shards, missing_shard
from inference.layouts.torch_zip import integers_under
from tests.cases import deepspeed_zero0, deepspeed_zero1, deepspeed_zero2, deepspeed_zero3
from tests.checkpoints import LayoutCase
from tests.layout_checks import consolidated_logits, reference_logits, replay_order, run_job

LAYOUT = get("deepspeed")


# ZeRO-2 writes the same files as ZeRO-1 (model states, then each rank's optimizer shard): its run is long.
@pytest.fixture(
    scope="module", params=[1, pytest.param(2, marks=pytest.mark.long), 3], ids=["zero1", "zero2", "zero3"]
)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    build = {1: deepspeed_zero1.build, 2: deepspeed_zero2.build, 3: deepspeed_zero3.build}[request.param]
    return build(tmp_path_factory.mktemp(f"zero{request.param}"))


def verdict(directory: Path) -> tuple[Readiness, str]:
    result = LAYOUT.inspect(directory, take_snapshot(directory), LayoutSettings())
    return result.readiness, result.reason


def test_the_committed_tag_and_an_older_one_are_complete(case: LayoutCase) -> None:
    for tag, step in (("global_step2", 2), ("global_step1", 1)):
        directory = case.source / tag
        assert LAYOUT.recognise(directory, take_snapshot(directory))
        assert verdict(directory) == (Readiness.COMPLETE, "complete")
        assert LAYOUT.step(directory) == (step, None)


def test_a_slow_writer_is_never_complete_before_latest(case: LayoutCase, tmp_path: Path) -> None:
    directory = tmp_path / "run" / case.candidate
    seen = [
        (step, verdict(directory)[0] if directory.is_dir() else Readiness.INCOMPLETE)
        for step in replay_order(case, tmp_path / "run")
    ]
    assert len(seen) > 3 * len(case.order)  # several appends per file
    assert [step for step, readiness in seen[:-1] if readiness is Readiness.COMPLETE] == []
    assert seen[-1][1] is Readiness.COMPLETE


def test_latest_naming_an_earlier_tag_leaves_the_folder_uncommitted(case: LayoutCase, tmp_path: Path) -> None:
    run = Path(shutil.copytree(case.source, tmp_path / "run"))
    (run / "latest").write_text("global_step1")
    assert verdict(run / "global_step2") == (
        Readiness.INCOMPLETE,
        "latest names 'global_step1', not 'global_step2': this checkpoint is not committed",
    )
    (run / "latest").unlink()
    assert verdict(run / "global_step1")[1].startswith("no latest file beside it yet")


def test_a_missing_optimizer_shard_is_named(case: LayoutCase, tmp_path: Path) -> None:
    run = Path(shutil.copytree(case.source, tmp_path / "run"))
    (run / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    readiness, reason = verdict(run / "global_step2")
    assert readiness is Readiness.INCOMPLETE
    assert reason.startswith("zero_pp_rank_1_mp_rank_00_optim_states.pt is missing (")
    assert "dp_world_size 2" in reason
    with pytest.raises(CheckpointInvalid, match=r"zero_pp_rank_1_mp_rank_00_optim_states\.pt is missing"):
        LAYOUT.materialise(run / "global_step2", LayoutSettings(hf_config=case.hf_config), tmp_path / "s")


def test_a_truncated_shard_is_incomplete(case: LayoutCase, tmp_path: Path) -> None:
    run = Path(shutil.copytree(case.source, tmp_path / "run"))
    shard = run / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:-100])
    readiness, reason = verdict(run / "global_step2")
    assert readiness is Readiness.INCOMPLETE
    assert reason == "zero_pp_rank_0_mp_rank_00_optim_states.pt: zip end record not written yet"


def test_consolidation_reproduces_the_trained_model(case: LayoutCase, tmp_path: Path) -> None:
    settings = LayoutSettings(hf_config=case.hf_config)
    folder = LAYOUT.materialise(case.source / case.candidate, settings, tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    expected = reference_logits(case)
    assert consolidated_logits(folder).sub(expected).abs().max().item() < 1e-5


def test_no_hf_config_says_which_setting_to_fill(case: LayoutCase, tmp_path: Path) -> None:
    with pytest.raises(CheckpointInvalid, match=r"global_step2: .*set runs\[\]\.hf_config"):
        LAYOUT.materialise(case.source / case.candidate, LayoutSettings(), tmp_path)


def test_a_shard_whose_pickle_runs_code_is_refused(case: LayoutCase, tmp_path: Path) -> None:
    import torch

    run = Path(shutil.copytree(case.source, tmp_path / "run"))
    witness = tmp_path / "pwned"
    torch.save(
        {"payload": Payload(str(witness))}, run / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    )
    assert verdict(run / "global_step2")[0] is Readiness.COMPLETE  # whole, so only loading can tell
    # The reason is torch's, without its advice to allowlist what it refused.
    with pytest.raises(
        CheckpointInvalid,
        match=r"refused to unpickle a shard that holds more than tensors: Unsupported global: GLOBAL "
        r"pathlib\.Path was not an allowed global by default\.$",
    ):
        LAYOUT.materialise(run / "global_step2", LayoutSettings(hf_config=case.hf_config), tmp_path / "s")
    assert not witness.exists()


class Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (Path(self.path),))


@pytest.fixture(scope="module")
def zero3(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    """One worker run per outcome is enough; ZeRO-3 is the harder consolidation."""
    return deepspeed_zero3.build(tmp_path_factory.mktemp("worker"))


def test_the_worker_evaluates_a_zero_checkpoint(zero3: LayoutCase, tmp_path: Path) -> None:
    result = run_job(zero3, tmp_path)
    assert result.error is None, result.error
    assert {m.name for m in result.metrics} >= {"accuracy", "response_length"}


def test_the_worker_without_hf_config_fails_with_the_fix(zero3: LayoutCase, tmp_path: Path) -> None:
    result = run_job(zero3, tmp_path, hf_config=None)
    assert result.error is not None
    assert result.error.kind == "checkpoint_invalid"
    assert "set runs[].hf_config" in result.error.message


def test_rules_without_files() -> None:
    assert commit_problem("global_step10", "global_step10\n") is None
    assert commit_problem("global_step9", "global_step10") is None
    assert commit_problem("global_step10", "global_step9") is not None
    assert commit_problem("global_step10", "best") is not None
    shards = expected_shards("zero_pp_rank_0_mp_rank_00_model_states.pt", 2, 1)
    assert shards.model_states == (
        "zero_pp_rank_0_mp_rank_00_model_states.pt",
        "zero_pp_rank_1_mp_rank_00_model_states.pt",
    )
    names = frozenset({*shards.model_states, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"})
    assert missing_shard(shards, names) == "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    import pickle

    data = pickle.dumps({"module": None, "dp_world_size": 4, "mp_world_size": 2, "other": "dp_world_size"})
    assert integers_under(data, frozenset({"dp_world_size", "mp_world_size"})) == {
        "dp_world_size": 4,
        "mp_world_size": 2,
    }


@pytest.fixture(scope="module")
def zero0(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    return deepspeed_zero0.build(tmp_path_factory.mktemp("zero0"))


def test_stage0_is_complete_once_latest_commits_it(zero0: LayoutCase, tmp_path: Path) -> None:
    assert verdict(zero0.source / zero0.candidate) == (Readiness.COMPLETE, "complete")
    folder = tmp_path / "run" / zero0.candidate
    states = [
        (step, verdict(folder)[0] if folder.is_dir() else Readiness.INCOMPLETE)
        for step in replay_order(zero0, tmp_path / "run")
    ]
    early = [step for step, readiness in states[:-1] if readiness is Readiness.COMPLETE]
    assert early == [] and states[-1][1] is Readiness.COMPLETE


def test_stage0_weights_come_from_the_model_states(zero0: LayoutCase, tmp_path: Path) -> None:
    folder = LAYOUT.materialise(
        zero0.source / zero0.candidate, LayoutSettings(hf_config=zero0.hf_config), tmp_path
    )
    assert consolidated_logits(folder).sub(reference_logits(zero0)).abs().max().item() < 1e-5
