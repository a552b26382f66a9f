"""Loading is a trust boundary: a pickle that would run code is refused, and the test proves it never ran."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from inference import layouts
from inference.errors import CheckpointInvalid
from inference.layouts import Readiness
from inference.layouts.base import take_snapshot
from inference.layouts.hf import read_torch_zip_end
from inference.loader import load_model
from inference.spec import EXIT_INPUT_ERROR, InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from tests.cases import hf_bin
from tests.checkpoints import LayoutCase
from tests.conftest import SUBPROCESS_ENV
from tests.deadlines import patient
from tests.forkserver import worker_python


class Payload:
    """Unpickling this opens ``path`` for writing, creating it: the file is the proof the pickle ran."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return (open, (str(self.path), "w"))


@pytest.fixture(scope="module")
def bin_case(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    return hf_bin.build(tmp_path_factory.mktemp("hf_bin"))


def poisoned_copy(case: LayoutCase, tmp_path: Path, proof: Path) -> Path:
    """The ``.bin`` checkpoint with one weight shard whose pickle carries the payload beside its tensors."""
    checkpoint = Path(shutil.copytree(case.source / case.candidate, tmp_path / "checkpoint"))
    shard = checkpoint / hf_bin.SHARDS[0]
    state = torch.load(shard, weights_only=True)
    torch.save({**state, "payload": Payload(proof)}, shard)
    return checkpoint


def test_the_payload_works_when_unpickled_unsafely(tmp_path: Path) -> None:
    # Without this, a payload that never fires would make the refusal tests pass for the wrong reason.
    proof = tmp_path / "proof"
    torch.save({"payload": Payload(proof)}, tmp_path / "p.bin")
    torch.load(tmp_path / "p.bin", weights_only=False)
    assert proof.exists()


def test_code_carrying_weights_are_refused_by_name(bin_case: LayoutCase, tmp_path: Path) -> None:
    proof = tmp_path / "proof"
    checkpoint = poisoned_copy(bin_case, tmp_path, proof)

    with pytest.raises(
        CheckpointInvalid,
        match=rf"{hf_bin.SHARDS[0]}: refused to unpickle: it needs more than tensors \(torch.load "
        r"weights_only=True said: Unsupported global: GLOBAL io\.open was not an allowed global "
        r"by default\.\)",
    ):
        load_model(checkpoint, InferenceSpec(), scratch=tmp_path / "scratch")
    assert not proof.exists()


def test_worker_refuses_code_carrying_weights(bin_case: LayoutCase, tmp_path: Path) -> None:
    proof = tmp_path / "proof"
    checkpoint = poisoned_copy(bin_case, tmp_path, proof)
    dataset = tmp_path / "data.jsonl"
    write_jsonl(held_out_problems(2, seed=4), dataset)
    spec = JobSpec(
        job_id=5,
        checkpoint_path=checkpoint,
        result_path=tmp_path / "result.json",
        task=TaskSpec(name="toy", dataset=dataset, prompt_template=PROMPT_TEMPLATE, metrics=("accuracy",)),
        inference=InferenceSpec(threads=1),
    )
    (tmp_path / "spec.json").write_text(spec.model_dump_json(), encoding="utf-8")
    done = subprocess.run(
        [worker_python(), "-m", "inference.worker", str(tmp_path / "spec.json")],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=patient(120),
    )

    assert done.returncode == EXIT_INPUT_ERROR, done.stderr
    error = JobResult.read(spec.result_path).error
    assert error is not None
    assert error.kind == "checkpoint_invalid"
    assert f"{hf_bin.SHARDS[0]}: refused to unpickle" in error.message
    assert not proof.exists()


def test_training_args_bin_is_never_opened(bin_case: LayoutCase, tmp_path: Path) -> None:
    proof = tmp_path / "proof"
    checkpoint = Path(shutil.copytree(bin_case.source / bin_case.candidate, tmp_path / "checkpoint"))
    torch.save(Payload(proof), checkpoint / "training_args.bin")

    loaded = load_model(checkpoint, InferenceSpec(), scratch=tmp_path / "scratch")

    assert loaded.model.config.vocab_size == len(loaded.tokenizer)
    assert not proof.exists()
    assert not (tmp_path / "scratch" / "safetensors" / "training_args.bin").exists()


def test_safetensors_are_preferred_over_bin(bin_case: LayoutCase, tmp_path: Path) -> None:
    # A folder with both: the .bin (poisoned here) is never read, because safetensors win.
    proof = tmp_path / "proof"
    checkpoint = poisoned_copy(bin_case, tmp_path, proof)
    from safetensors.torch import save_file

    state: dict[str, torch.Tensor] = {}
    for shard in hf_bin.SHARDS:
        state.update(torch.load(bin_case.source / bin_case.candidate / shard, weights_only=True))
    save_file({k: v.clone() for k, v in state.items()}, str(checkpoint / "model.safetensors"))

    assert layouts.get("hf").materialise(checkpoint, layouts.LayoutSettings(), tmp_path / "s") == checkpoint
    load_model(checkpoint, InferenceSpec(), scratch=tmp_path / "scratch")
    assert not proof.exists()


def test_bin_shard_cut_short_is_refused_once_quiet(bin_case: LayoutCase, tmp_path: Path) -> None:
    checkpoint = Path(shutil.copytree(bin_case.source / bin_case.candidate, tmp_path / "checkpoint"))
    shard = checkpoint / hf_bin.SHARDS[1]
    data = shard.read_bytes()
    for cut in (3, 100, len(data) // 2, len(data) - 23, len(data) - 1):
        shard.write_bytes(data[:cut])
        verdict = layouts.hf.inspect(checkpoint, take_snapshot(checkpoint))
        # Invalid once the folder is quiet, not final: a write in progress looks the same for a moment.
        assert verdict.readiness is Readiness.INVALID and not verdict.final, (cut, verdict)
        assert verdict.reason.startswith(hf_bin.SHARDS[1])
    shard.write_bytes(data)
    assert layouts.hf.inspect(checkpoint, take_snapshot(checkpoint)) == layouts.Verdict.complete()


def test_legacy_pickle_weights_are_invalid(tmp_path: Path) -> None:
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2)}, path, _use_new_zipfile_serialization=False)

    header = read_torch_zip_end(path)
    assert header.problem is not None and "legacy format" in header.problem
    assert not header.maybe_partial


def test_bin_index_naming_a_missing_shard(bin_case: LayoutCase, tmp_path: Path) -> None:
    checkpoint = Path(shutil.copytree(bin_case.source / bin_case.candidate, tmp_path / "checkpoint"))
    index = json.loads((checkpoint / "pytorch_model.bin.index.json").read_text())
    index["weight_map"]["extra.weight"] = "pytorch_model-00003-of-00003.bin"
    (checkpoint / "pytorch_model.bin.index.json").write_text(json.dumps(index))

    verdict = layouts.hf.inspect(checkpoint, take_snapshot(checkpoint))
    assert verdict.reason == (
        "shard pytorch_model-00003-of-00003.bin named in pytorch_model.bin.index.json is missing"
    )
    with pytest.raises(CheckpointInvalid, match=r"pytorch_model-00003-of-00003\.bin named in"):
        load_model(checkpoint, InferenceSpec(), scratch=tmp_path / "scratch")
