"""LoRA adapters (issue 31): a PEFT adapter saved the way TRL's Trainer saves it (``checkpoint-N/`` with
``adapter_model.safetensors``, ``adapter_config.json``, the tokenizer and ``trainer_state.json`` last)
is evaluated merged into its base, and scores what the merged model saved with ``save_pretrained``
scores; one whose base is a Hub id with no local copy is invalid, named, beside them.

The adapter is trained here for a few steps on the session's toy model (``step_15``, half trained), so
the merged weights differ from the base's and the comparison can fail.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from inference import layouts
from inference.layouts import LayoutSettings, Readiness, lora
from storage import queries
from storage.database import Database
from tests.conftest import TOY_SAVE_EVERY, ToyRun
from tests.harness import evald, jobs, running_daemon, upgraded, wait_for, write_config, write_dataset

HUB_ID = "Qwen/Qwen2.5-0.5B-Instruct"
#: Metrics that depend on the weights alone (tokens/s and wall time depend on the machine's load).
COMPARED = ("accuracy", "response_length", "truncation_rate")


@dataclass(frozen=True)
class Adapter:
    base: Path
    #: ``checkpoint-10/`` as TRL saves it, naming ``base`` in its adapter_config.json.
    checkpoint: Path
    #: The same adapter merged into the base by PEFT and saved with ``save_pretrained``.
    merged: Path


def _trainer_files(folder: Path, step: int, tokenizer_from: Path) -> None:
    """What the Trainer adds to ``save_model``'s files: the tokenizer, then ``trainer_state.json`` last."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_from / name, folder / name)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))


@pytest.fixture(scope="module")
def adapter(toy_run: ToyRun, tmp_path_factory: pytest.TempPathFactory) -> Adapter:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from inference.toy.problems import training_problems
    from inference.toy.tokenizer import build_tokenizer
    from inference.toy.trainer import encode_problems

    folder = tmp_path_factory.mktemp("lora")
    base = shutil.copytree(toy_run.path / f"step_{TOY_SAVE_EVERY}", folder / "base")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    tuned = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    input_ids, attention_mask, labels = encode_problems(build_tokenizer(), training_problems()[:64])
    optimizer = torch.optim.AdamW([p for p in tuned.parameters() if p.requires_grad], lr=1e-2)
    tuned.train()
    for _ in range(8):
        loss = tuned(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    tuned.eval()
    checkpoint = folder / "checkpoint-10"
    tuned.save_pretrained(str(checkpoint))
    _trainer_files(checkpoint, 10, base)
    merged = folder / "merged"
    merged_model: Any = tuned.merge_and_unload()
    merged_model.save_pretrained(merged)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(base / name, merged / name)
    return Adapter(base=base, checkpoint=checkpoint, merged=merged)


def _with_base(source: Path, target: Path, base_name: str) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / lora.ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = base_name
    (target / lora.ADAPTER_CONFIG).write_text(json.dumps(config))
    step = int(target.name.removeprefix("checkpoint-"))
    (target / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    return target


def _verdict(folder: Path, settings: LayoutSettings | None = None) -> layouts.Verdict:
    snapshot = layouts.take_snapshot(folder)
    layout = layouts.detect(folder, snapshot, "auto")
    assert layout == "lora"
    return layouts.inspect(folder, snapshot, layout, settings)


def test_an_adapter_checkpoint_is_recognised_and_complete(adapter: Adapter) -> None:
    assert _verdict(adapter.checkpoint).readiness is Readiness.COMPLETE
    assert layouts.get("lora").step(adapter.checkpoint) == (10, None)


def test_a_hub_base_needs_runs_base_model_and_takes_it(adapter: Adapter, tmp_path: Path) -> None:
    hub = _with_base(adapter.checkpoint, tmp_path / "checkpoint-10", HUB_ID)

    verdict = _verdict(hub)

    assert verdict.readiness is Readiness.INVALID
    assert HUB_ID in verdict.reason
    assert "runs[].base_model" in verdict.reason and "base_model_name_or_path" in verdict.reason
    configured = _verdict(hub, LayoutSettings(base_model=adapter.base))
    assert configured.readiness is Readiness.COMPLETE
    missing = _verdict(hub, LayoutSettings(base_model=tmp_path))
    assert (missing.readiness, missing.reason) == (
        Readiness.INVALID,
        f"runs[].base_model {tmp_path} has no config.json",
    )


def test_an_adapter_being_written_is_incomplete(adapter: Adapter, tmp_path: Path) -> None:
    # PEFT writes the weights, then adapter_config.json; the Trainer writes trainer_state.json last.
    folder = shutil.copytree(adapter.checkpoint, tmp_path / "checkpoint-10")
    (folder / "trainer_state.json").unlink()
    assert _verdict(folder).reason == "no trainer_state.json yet (the Trainer writes it last)"
    _trainer_files(folder, 10, adapter.base)
    (folder / lora.ADAPTER_CONFIG).unlink()
    assert _verdict(folder).readiness is Readiness.INCOMPLETE
    shutil.copyfile(adapter.checkpoint / lora.ADAPTER_CONFIG, folder / lora.ADAPTER_CONFIG)
    weights = folder / lora.ADAPTER_WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[:-100])
    cut = _verdict(folder)
    # Named once the folder is quiet (not final: a write in progress looks the same for a moment).
    assert cut.readiness is Readiness.INVALID and not cut.final and "truncated" in cut.reason
    weights.write_bytes(data + b"\0" * 10)
    assert _verdict(folder) == layouts.Verdict(
        Readiness.INVALID, f"{lora.ADAPTER_WEIGHTS}: 10 bytes past the tensor data"
    )


def test_the_merged_adapter_matches_what_peft_merges(adapter: Adapter, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    folder = layouts.get("lora").materialise(adapter.checkpoint, LayoutSettings(), tmp_path / "scratch")

    ours = load_file(folder / "model.safetensors")
    theirs = load_file(adapter.merged / "model.safetensors")
    base = load_file(adapter.base / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not ours[name].equal(base[name])  # the adapter changed the weights
    assert set(ours) == set(theirs) and all(ours[k].equal(theirs[k]) for k in ours)
    assert (folder / "tokenizer.json").is_file()


def _scores(database: Database, steps: set[int]) -> dict[int, dict[str, float]] | None:
    with database.session() as session:
        rows = queries.result_rows(session, run="toy")
    found: dict[int, dict[str, float]] = {}
    for row in rows:
        if row.step in steps:
            found.setdefault(row.step, {})[row.metric] = row.value
    return found if set(found) == steps else None


@pytest.mark.slow
def test_a_daemon_evaluates_an_adapter_as_its_merged_model_scores(
    database_url: str, adapter: Adapter, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    dataset = write_dataset(tmp_path / "arith.jsonl", 8)
    config = write_config(tmp_path, database_url, dataset=dataset)
    root = tmp_path / "run"
    shutil.copytree(adapter.checkpoint, root / "checkpoint-10")
    # The merged model as a plain Trainer checkpoint beside it: evaluated the same way, by the same daemon.
    merged = shutil.copytree(adapter.merged, root / "checkpoint-40")
    _trainer_files(merged, 40, adapter.base)
    _with_base(adapter.checkpoint, root / "checkpoint-30", HUB_ID)

    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        scores = wait_for(lambda: _scores(database, {10, 40}), 180, "both evaluated", daemon.process)
        status = evald("--config", str(config), "status")
        assert daemon.stop() == 0

    for metric in COMPARED:
        assert scores[10][metric] == pytest.approx(scores[40][metric], abs=1e-6), metric
    assert {j.step: j.state for j in jobs(database)} == {10: "succeeded", 40: "succeeded"}
    with database.session() as session:
        rows = {c.name: c for c in queries.checkpoint_rows(session)}
    hub = rows["checkpoint-30"]
    assert hub.state == "invalid" and hub.reason is not None
    assert HUB_ID in hub.reason and "runs[].base_model" in hub.reason
    assert status.returncode == 0 and "checkpoint-30" in status.stdout and HUB_ID in status.stdout
    named = [
        line
        for line in log.read_text().splitlines()
        if "checkpoint-30" in line and ('"warning"' in line or '"error"' in line)
    ]
    assert len(named) == 1, named
    database.dispose()
