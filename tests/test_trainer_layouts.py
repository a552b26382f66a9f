"""DCP, verl, AReaL and ``.bin`` save_pretrained checkpoints: readiness while written, conversion, worker."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

from inference import layouts
from inference.errors import CheckpointInvalid
from inference.layouts import LayoutSettings, Readiness
from inference.layouts.base import take_snapshot
from inference.loader import load_model
from inference.spec import InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from tests.cases import areal, dcp, hf_bin, verl
from tests.checkpoints import LayoutCase
from tests.conftest import SUBPROCESS_ENV
from tests.deadlines import patient
from tests.forkserver import worker_python
from tests.layout_checks import replay_order

CASES: dict[str, ModuleType] = {"dcp": dcp, "verl": verl, "areal": areal, "hf_bin": hf_bin}


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LayoutCase]:
    return {name: module.build(tmp_path_factory.mktemp(name)) for name, module in CASES.items()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "heldout.jsonl"
    write_jsonl(held_out_problems(4, seed=3), path)
    return path


def settings_of(case: LayoutCase) -> LayoutSettings:
    return LayoutSettings(hf_config=case.hf_config)


def verdict_of(case: LayoutCase, root: Path) -> layouts.Verdict:
    directory = root / case.candidate
    return layouts.get(case.layout).inspect(directory, take_snapshot(directory), settings_of(case))


def source_weights(case: LayoutCase) -> dict[str, torch.Tensor]:
    """The weights the trainer saved, read straight from the case's source files."""
    folder = case.source / case.candidate
    if case.layout == "verl":
        return load_file(folder / "actor/huggingface/model.safetensors")
    if case.layout == "areal":
        return load_file(folder / "model.safetensors")
    if case.layout == "hf":
        merged: dict[str, torch.Tensor] = {}
        for shard in hf_bin.SHARDS:
            merged.update(torch.load(folder / shard, weights_only=True))
        return merged
    from torch.distributed.checkpoint.state_dict_loader import load

    from tests.toy_model import toy_model

    # Zeroed tensors shaped like the model's, for torch's own (trusting) reader to fill in place.
    model = {name: torch.zeros_like(t) for name, t in toy_model()[0].state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process"
        load({"model": model}, checkpoint_id=str(folder), no_dist=True)
    return model


@pytest.mark.parametrize("name", list(CASES))
def test_finished_checkpoint_is_recognised_and_complete(cases: dict[str, LayoutCase], name: str) -> None:
    case = cases[name]
    directory = case.source / case.candidate
    snapshot = take_snapshot(directory)
    layout = layouts.get(case.layout)

    assert layout.recognise(directory, snapshot)
    assert layouts.detect(directory, snapshot, "auto") == case.layout
    assert layout.step(directory) == (case.step, case.epoch)
    assert verdict_of(case, case.source) == layouts.Verdict.complete()
    # The order the slow-writer tests replay holds every file the trainer wrote, once.
    written = sorted(str(p.relative_to(case.source)) for p in case.source.rglob("*") if p.is_file())
    assert written == sorted(case.order)


@pytest.mark.parametrize("name", list(CASES))
def test_never_complete_before_the_last_write(
    cases: dict[str, LayoutCase], name: str, tmp_path: Path
) -> None:
    case = cases[name]
    states = 0
    for described in replay_order(case, tmp_path):
        if not (tmp_path / case.candidate).is_dir():
            continue
        verdict = verdict_of(case, tmp_path)
        last = described.startswith(case.order[-1]) and described.endswith(" bytes") and _whole(described)
        if last:
            assert verdict.readiness is Readiness.COMPLETE, verdict.reason
        else:
            assert verdict.readiness is not Readiness.COMPLETE, described
        states += 1
    assert states >= 2 * len(case.order)


def _whole(described: str) -> bool:
    done, _, total = described.rpartition(": ")[2].removesuffix(" bytes").partition("/")
    return done == total


@pytest.mark.parametrize("name", list(CASES))
def test_materialised_weights_equal_the_source(
    cases: dict[str, LayoutCase], name: str, tmp_path: Path
) -> None:
    case = cases[name]
    folder = layouts.get(case.layout).materialise(case.source / case.candidate, settings_of(case), tmp_path)
    converted = load_file(folder / "model.safetensors")
    source = source_weights(case)

    assert set(converted) >= set(source) - {"lm_head.weight"}
    for key, tensor in source.items():
        if key in converted:
            assert torch.equal(converted[key], tensor), key


def start_worker(case: LayoutCase, dataset: Path, folder: Path) -> tuple[subprocess.Popen[str], Path]:
    folder.mkdir(parents=True, exist_ok=True)
    spec = JobSpec(
        job_id=3,
        checkpoint_path=case.source / case.candidate,
        layout=case.layout,
        hf_config=case.hf_config,
        result_path=folder / "result.json",
        task=TaskSpec(
            name="toy",
            dataset=dataset,
            prompt_template=PROMPT_TEMPLATE,
            batch_size=4,
            max_new_tokens=8,
            metrics=("accuracy", "response_length"),
        ),
        inference=InferenceSpec(threads=1),
    )
    spec_path = folder / "spec.json"
    spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
    process = subprocess.Popen(
        [worker_python(), "-m", "inference.worker", str(spec_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=SUBPROCESS_ENV,
    )
    return process, spec.result_path


@pytest.fixture(scope="module")
def worker_runs(
    cases: dict[str, LayoutCase], dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[int, JobResult, str]]:
    """Every case evaluated by a real worker process, all at once (each is mostly import time)."""
    root = tmp_path_factory.mktemp("workers")
    started = {name: start_worker(case, dataset, root / name) for name, case in cases.items()}
    runs = {}
    try:
        for name, (process, result_path) in started.items():
            # As long as one worker may take (layout_checks.run_job): four at once on a busy two-core
            # machine, beside another test process, took longer than three minutes.
            _, stderr = process.communicate(timeout=patient(300))
            runs[name] = (process.returncode, JobResult.read(result_path), stderr)
    finally:
        for process, _ in started.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return runs


@pytest.mark.parametrize("name", list(CASES))
def test_worker_evaluates_each_layout(worker_runs: dict[str, tuple[int, JobResult, str]], name: str) -> None:
    code, result, stderr = worker_runs[name]

    assert code == 0, stderr
    assert result.error is None
    assert {m.name: m.n for m in result.metrics} == {"accuracy": 4, "response_length": 4}


def test_dcp_without_hf_config_names_the_setting(cases: dict[str, LayoutCase], tmp_path: Path) -> None:
    case = cases["dcp"]
    with pytest.raises(CheckpointInvalid, match=r"step-7: .*set runs\[\]\.hf_config"):
        layouts.get("dcp").materialise(case.source / case.candidate, LayoutSettings(), tmp_path)


def test_dcp_missing_data_file_is_invalid(cases: dict[str, LayoutCase], tmp_path: Path) -> None:
    case = cases["dcp"]
    copy = Path(shutil.copytree(case.source / case.candidate, tmp_path / "step-7"))
    (copy / "__0_0.distcp").unlink()

    verdict = layouts.get("dcp").inspect(copy, take_snapshot(copy), settings_of(case))
    assert verdict == layouts.Verdict(Readiness.INVALID, "__0_0.distcp, named in .metadata, is missing")


class _Payload:
    """Unpickling this would create ``path``: the proof that a pickle ran code."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return (open, (str(self.path), "w"))


def test_dcp_metadata_that_would_run_code_is_refused(cases: dict[str, LayoutCase], tmp_path: Path) -> None:
    import pickle

    case = cases["dcp"]
    copy = Path(shutil.copytree(case.source / case.candidate, tmp_path / "step-7"))
    proof = tmp_path / "pwned"
    (copy / ".metadata").write_bytes(pickle.dumps(_Payload(proof)))

    verdict = layouts.get("dcp").inspect(copy, take_snapshot(copy), settings_of(case))
    assert verdict.readiness is Readiness.INVALID
    assert "io.open is not allowed in DCP metadata" in verdict.reason
    with pytest.raises(CheckpointInvalid, match=r"\.metadata: refused"):
        load_model(copy, InferenceSpec(), layout="dcp", settings=settings_of(case), scratch=tmp_path / "s")
    assert not proof.exists()


@pytest.fixture
def verl_config_only(tmp_path: Path) -> LayoutCase:
    return verl.build_config_only(tmp_path)


def test_verl_without_weights_says_how_to_save_them(verl_config_only: LayoutCase, tmp_path: Path) -> None:
    case = verl_config_only
    verdict = verdict_of(case, case.source)

    assert verdict.readiness is Readiness.INVALID
    assert "actor/huggingface has no weights" in verdict.reason
    assert "'hf_model' to actor_rollout_ref.actor.checkpoint.save_contents" in verdict.reason
    with pytest.raises(CheckpointInvalid, match=r"no weights: verl saved only the config and tokenizer"):
        load_model(case.source / case.candidate, InferenceSpec(), layout="verl", scratch=tmp_path / "s")


def test_verl_waits_for_the_tracker(cases: dict[str, LayoutCase], tmp_path: Path) -> None:
    case = cases["verl"]
    root = Path(shutil.copytree(case.source, tmp_path / "run"))
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    assert verdict_of(case, root).reason == "latest_checkpointed_iteration.txt says step 1, before 2"
    (root / "latest_checkpointed_iteration.txt").write_text("4")
    assert verdict_of(case, root) == layouts.Verdict.complete()


MODEL_NAMES = frozenset({"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"})


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        # {"model": state_dict} flattened by DCP
        (
            ["model.model.embed_tokens.weight", "model.model.norm.weight", "model.lm_head.weight", "optim.x"],
            {
                "model.model.embed_tokens.weight": "model.embed_tokens.weight",
                "model.model.norm.weight": "model.norm.weight",
                "model.lm_head.weight": "lm_head.weight",
            },
        ),
        # the HF names as they are
        (sorted(MODEL_NAMES), {name: name for name in MODEL_NAMES}),
        # a DDP / torch.compile wrapper
        (
            ["module._orig_mod.model.embed_tokens.weight", "module._orig_mod.lm_head.weight"],
            {
                "module._orig_mod.model.embed_tokens.weight": "model.embed_tokens.weight",
                "module._orig_mod.lm_head.weight": "lm_head.weight",
            },
        ),
        # the inner base model saved on its own (tied embeddings: no lm_head)
        (
            ["embed_tokens.weight", "norm.weight"],
            {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"},
        ),
        (["optimizer.state.0.exp_avg"], {}),
    ],
)
def test_dcp_names_map_onto_the_model(stored: list[str], expected: dict[str, str]) -> None:
    from inference.layouts.dcp import key_mapping

    assert key_mapping(stored, MODEL_NAMES) == expected


@pytest.mark.parametrize(
    ("text", "readiness", "reason"),
    [
        (None, Readiness.INCOMPLETE, "no latest_checkpointed_iteration.txt beside it yet"),
        ("", Readiness.INCOMPLETE, "latest_checkpointed_iteration.txt is empty (being written)"),
        ("1", Readiness.INCOMPLETE, "latest_checkpointed_iteration.txt says step 1, before 2"),
        (
            "release",
            Readiness.INVALID,
            "latest_checkpointed_iteration.txt holds 'release', not a step number",
        ),
    ],
)
def test_verl_tracker_rule(text: str | None, readiness: Readiness, reason: str) -> None:
    from inference.layouts.verl import assess_tracker

    verdict = assess_tracker(2, text)
    assert verdict is not None
    assert verdict.readiness is readiness
    assert verdict.reason.startswith(reason)
    assert assess_tracker(2, "2\n") is None
    assert assess_tracker(2, "3") is None
