"""A tensor-only checkpoint's model config is found beside it; ``runs[].hf_config`` still wins when set.

Real checkpoints: torch's DCP writer (``tests/cases/dcp``) and the real DeepSpeed engine on 2 CPU ranks,
saved as OpenRLHF's actor saves (``tests/writers/deepspeed_engine.py``). The config and tokenizer are put
where trainers put them, with ``save_pretrained`` as they do.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from daemon.cli import main
from daemon.config import load_config
from daemon.running.job_queue import build_spec
from inference.errors import CheckpointInvalid
from inference.layouts import LayoutSettings, get
from inference.layouts.model_config import search_path
from storage.queries import ClaimedJob
from tests.cases import dcp, openrlhf
from tests.checkpoints import LayoutCase
from tests.harness import write_config, write_dataset
from tests.layout_checks import PROMPTS, consolidated_logits, reference_logits
from tests.toy_model import toy_model

if TYPE_CHECKING:
    import torch

#: The toy model weights the DCP case saved (``toy_model(seed=7)``).
DCP_SEED = 7


@pytest.fixture(scope="module")
def dcp_case(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    return dcp.build(tmp_path_factory.mktemp("dcp"))


@pytest.fixture(scope="module")
def engine_case(tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    """ZeRO-3 on 2 ranks saved as OpenRLHF does: ``ckpt/_actor/global_stepN`` (a plain DeepSpeed
    ``save_dir``) and ``ckpt/global_stepN_hf``; ``ckpt_reference/hf_config`` is rank 0's save_pretrained."""
    return openrlhf.build(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def dcp_logits() -> torch.Tensor:
    import torch

    model, tokenizer = toy_model(seed=DCP_SEED)
    with torch.no_grad():
        logits: torch.Tensor = model(**tokenizer(list(PROMPTS), return_tensors="pt", padding=True)).logits
    return logits


def save_config(folder: Path, *, source: str) -> Path:
    """``config.json`` and the tokenizer saved into ``folder`` with ``save_pretrained``, as trainers do;
    ``source`` is written into the config so a test can tell which folder was used."""
    model, tokenizer = toy_model(seed=DCP_SEED)
    model.config.evald_source = source  # kept by save_pretrained, ignored by from_pretrained
    model.config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def copy_dcp(case: LayoutCase, target: Path) -> Path:
    return Path(shutil.copytree(case.source / case.candidate, target))


def source_of(materialised: Path) -> str:
    source: str = json.loads((materialised / "config.json").read_text())["evald_source"]
    return source


# --- where it looks (pure) ---


def test_search_path_walks_up_to_the_run_root(tmp_path: Path) -> None:
    root = tmp_path / "run"
    checkpoint = root / "ckpt" / "_actor" / "global_step2"
    assert search_path(checkpoint, root, checkpoint.parent) == (
        checkpoint,
        root / "ckpt" / "_actor",
        root / "ckpt",
        root,
    )
    # The run root unknown (``evald eval``) or not above the checkpoint: the layout's save folder is the top.
    assert search_path(checkpoint, None, checkpoint.parent) == (checkpoint, checkpoint.parent)
    assert search_path(checkpoint, tmp_path / "other", checkpoint.parent) == (checkpoint, checkpoint.parent)
    # A save folder above a root set too low still counts: the higher of the two is the top.
    assert search_path(checkpoint, checkpoint.parent, root / "ckpt") == (
        checkpoint,
        root / "ckpt" / "_actor",
        root / "ckpt",
    )
    assert search_path(checkpoint, checkpoint, checkpoint) == (checkpoint,)


# --- DCP ---


def test_dcp_with_config_inside_loads_without_hf_config(
    dcp_case: LayoutCase, dcp_logits: torch.Tensor, tmp_path: Path
) -> None:
    folder = save_config(copy_dcp(dcp_case, tmp_path / "run" / "step-7"), source="checkpoint")
    materialised = get("dcp").materialise(folder, LayoutSettings(), tmp_path / "scratch")
    assert source_of(materialised) == "checkpoint"
    assert (materialised / "tokenizer.json").is_file()
    assert consolidated_logits(materialised).sub(dcp_logits).abs().max().item() < 1e-6


def test_dcp_config_in_the_run_root_is_found_only_up_to_the_root(
    dcp_case: LayoutCase, tmp_path: Path
) -> None:
    root = save_config(tmp_path / "run", source="root")
    folder = copy_dcp(dcp_case, root / "checkpoints" / "step-7")
    settings = LayoutSettings(run_root=root)
    assert source_of(get("dcp").materialise(folder, settings, tmp_path / "scratch")) == "root"
    # Without the run root only the save folder is looked at: a config.json above it is not the model's.
    with pytest.raises(CheckpointInvalid) as refused:
        get("dcp").materialise(folder, LayoutSettings(), tmp_path / "scratch2")
    assert str(refused.value) == (
        f"{folder}: a DCP checkpoint holds only tensors; {folder}/ has no config.json, "
        f"{folder.parent}/ has no config.json; set runs[].hf_config to a folder with the model's "
        "config.json and tokenizer files"
    )


def test_hf_config_wins_over_the_config_in_the_checkpoint(dcp_case: LayoutCase, tmp_path: Path) -> None:
    folder = save_config(copy_dcp(dcp_case, tmp_path / "run" / "step-7"), source="checkpoint")
    chosen = save_config(tmp_path / "hf_config", source="hf_config")
    tokenizer_config = chosen / "tokenizer_config.json"
    marked = {**json.loads(tokenizer_config.read_text()), "evald_source": "hf_config"}
    tokenizer_config.write_text(json.dumps(marked))
    settings = LayoutSettings(hf_config=chosen, run_root=tmp_path / "run")
    materialised = get("dcp").materialise(folder, settings, tmp_path / "scratch")
    assert source_of(materialised) == "hf_config"
    assert json.loads((materialised / "tokenizer_config.json").read_text())["evald_source"] == "hf_config"


def test_hf_config_without_config_json_is_named(dcp_case: LayoutCase, tmp_path: Path) -> None:
    folder = save_config(copy_dcp(dcp_case, tmp_path / "run" / "step-7"), source="checkpoint")
    empty = tmp_path / "hf_config"
    empty.mkdir()
    # Set but wrong is an error, not a silent fall-back to the checkpoint's own config.
    with pytest.raises(CheckpointInvalid, match=r"hf_config: no config\.json \(runs\[\]\.hf_config must"):
        get("dcp").materialise(folder, LayoutSettings(hf_config=empty), tmp_path / "scratch")


# --- DeepSpeed engine and OpenRLHF actor ---


def test_deepspeed_config_in_the_save_dir_loads_without_hf_config(
    engine_case: LayoutCase, tmp_path: Path
) -> None:
    ckpt = Path(shutil.copytree(engine_case.source, tmp_path / "ckpt"))
    save_dir = ckpt / "_actor"
    # A training script's ``model.config.save_pretrained(save_dir)`` and ``tokenizer.save_pretrained``.
    for path in (engine_case.hf_config or Path()).iterdir():
        shutil.copy(path, save_dir / path.name)
    materialised = get("deepspeed").materialise(save_dir / "global_step2", LayoutSettings(), tmp_path / "s")
    assert (materialised / "tokenizer.json").is_file()
    assert consolidated_logits(materialised).sub(reference_logits(engine_case)).abs().max().item() < 1e-5


def test_openrlhf_actor_uses_a_config_in_the_run_root(engine_case: LayoutCase, tmp_path: Path) -> None:
    root = tmp_path / "run"
    ckpt = Path(shutil.copytree(engine_case.source, root / "ckpt"))
    shutil.rmtree(ckpt / "global_step2_hf")
    save_config(root, source="root")
    actor = ckpt / "_actor" / "global_step2"
    materialised = get("openrlhf").materialise(actor, LayoutSettings(run_root=root), tmp_path / "s")
    assert source_of(materialised) == "root"
    assert consolidated_logits(materialised).sub(reference_logits(engine_case)).abs().max().item() < 1e-5


def test_nothing_found_names_every_place_looked_at(engine_case: LayoutCase, tmp_path: Path) -> None:
    root = tmp_path / "run"
    ckpt = Path(shutil.copytree(engine_case.source, root / "ckpt"))
    shutil.rmtree(ckpt / "global_step2_hf")
    actor = ckpt / "_actor" / "global_step2"
    with pytest.raises(CheckpointInvalid) as refused:
        get("openrlhf").materialise(actor, LayoutSettings(run_root=root), tmp_path / "s")
    places = (actor, ckpt / "_actor", ckpt, root, ckpt / "global_step2_hf")
    assert str(refused.value) == (
        f"{actor}: an OpenRLHF actor checkpoint holds only tensors; "
        + ", ".join(f"{place}/ has no config.json" for place in places)
        + "; set runs[].hf_config to a folder with the model's config.json and tokenizer files"
    )
    with pytest.raises(CheckpointInvalid, match=r"_actor/ has no config\.json; set runs\[\]\.hf_config"):
        get("deepspeed").materialise(actor, LayoutSettings(), tmp_path / "s")


# --- through the daemon's spec and the CLI ---


def test_the_daemon_hands_the_run_root_to_the_worker(tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "arith.jsonl", 2)
    config = load_config(write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=dataset))
    job = ClaimedJob(
        id=1,
        task=config.tasks[0].name,
        stage="full",
        attempts=0,
        checkpoint_id=1,
        checkpoint_path=str(tmp_path / "run" / "step-7"),
        layout="dcp",
        step=7,
        run=config.runs[0].name,
        run_id=1,
    )
    spec = build_spec(config, job, tmp_path / "job")
    assert spec.run_root == config.runs[0].root == (tmp_path / "run").resolve()


def test_evald_eval_on_a_dcp_folder_with_its_config(
    dcp_case: LayoutCase, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = save_config(copy_dcp(dcp_case, tmp_path / "ckpts" / "step-7"), source="checkpoint")
    dataset = write_dataset(tmp_path / "arith.jsonl", 2)
    path = str(write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=dataset))
    assert main(["--config", path, "eval", str(folder), "--format", "json"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"][0]["n"]["accuracy"] == 2
