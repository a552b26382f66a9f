"""verl: ``global_step_N/actor/`` with ``huggingface/``, and ``latest_checkpointed_iteration.txt`` beside.

What verl writes for step N, in order (followed from ``verl/utils/checkpoint/fsdp_checkpoint_manager.py``,
``FSDPCheckpointManager.save_checkpoint``, and ``verl/trainer/ppo/ray_trainer.py``, ``_save_checkpoint``):

1. ``global_step_N/actor/model_world_size_{W}_rank_{r}.pt``, ``optim_world_size_{W}_rank_{r}.pt``,
   ``extra_state_world_size_{W}_rank_{r}.pt`` (every rank, FSDP-sharded pickles);
2. ``global_step_N/actor/huggingface/``: ``config.json`` and the tokenizer, always; then
   ``global_step_N/actor/fsdp_config.json``;
3. only if ``checkpoint.save_contents`` includes ``hf_model``: ``save_pretrained`` of the full model into
   ``huggingface/`` (``model.safetensors`` or shards plus index);
4. ``global_step_N/critic/`` (same, if a critic is trained) and ``global_step_N/data.pt`` (dataloader);
5. ``latest_checkpointed_iteration.txt`` in the run root, holding ``N`` ("for atomic usage").

So a step is complete when the tracker says ``N`` or later and ``huggingface/`` holds whole weights.
The FSDP ``.pt`` shards are pickles that need more than ``weights_only`` and are never loaded here.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from inference.errors import CheckpointInvalid
from inference.layouts import files, hf
from inference.layouts.base import FileStat, Layout, LayoutSettings, Readiness, Snapshot, Verdict

NAME = "verl"
TRACKER_FILE = "latest_checkpointed_iteration.txt"
FOLDER = re.compile(r"global_step_(\d+)")
HF_FOLDER = "actor/huggingface"
#: How to make verl write the weights (``BaseCheckpointManager.should_save_hf_model`` reads this list).
SAVE_HF_HINT = (
    "verl saved only the config and tokenizer there, not the weights: add 'hf_model' to"
    " actor_rollout_ref.actor.checkpoint.save_contents (e.g. save_contents=['model','optimizer','extra',"
    "'hf_model']), or merge the FSDP shards with `python -m verl.model_merger merge --backend fsdp"
    " --local_dir <global_step_N>/actor --target_dir <folder>` and evaluate that folder"
)


def folder_step(name: str) -> int | None:
    match = FOLDER.fullmatch(name)
    return int(match.group(1)) if match else None


def sub_snapshot(snapshot: Snapshot, prefix: str) -> Snapshot:
    """The files under ``prefix/``, with paths relative to it (pure)."""
    lead = prefix.rstrip("/") + "/"
    return Snapshot(
        tuple(
            replace(f, relpath=f.relpath[len(lead) :]) for f in snapshot.files if f.relpath.startswith(lead)
        )
    )


def read_tracker(root: Path) -> str | None:
    return files.read_text(root / TRACKER_FILE, limit=files.MAX_TAG_BYTES)


def assess_tracker(step: int, tracker_text: str | None) -> Verdict | None:
    """``None`` when the tracker says step ``step`` is saved, else why not (pure)."""
    if tracker_text is None:
        return Verdict(
            Readiness.INCOMPLETE, f"no {TRACKER_FILE} beside it yet (verl writes it after the step)"
        )
    text = tracker_text.strip()
    if not text:
        return Verdict(Readiness.INCOMPLETE, f"{TRACKER_FILE} is empty (being written)")
    if not text.isdigit():
        return Verdict(Readiness.INVALID, f"{TRACKER_FILE} holds {text[:40]!r}, not a step number")
    if int(text) < step:
        return Verdict(Readiness.INCOMPLETE, f"{TRACKER_FILE} says step {int(text)}, before {step}")
    return None


def has_weights(snapshot: Snapshot) -> bool:
    names = snapshot.names()
    return bool({hf.SINGLE_FILE, hf.INDEX_FILE, hf.BIN_SINGLE_FILE, hf.BIN_INDEX_FILE} & names)


@files.judged
def inspect(directory: Path, snapshot: Snapshot) -> Verdict:
    step = folder_step(directory.name)
    if step is None:
        return Verdict(Readiness.INVALID, f"{directory.name} is not a verl global_step_N folder")
    waiting = assess_tracker(step, read_tracker(directory.parent))
    if waiting is not None:
        return waiting
    weights = sub_snapshot(snapshot, HF_FOLDER)
    if not weights.files:
        return Verdict(
            Readiness.INVALID, f"no {HF_FOLDER}/ folder although {TRACKER_FILE} marks the step saved"
        )
    if not has_weights(weights):
        return Verdict(Readiness.INVALID, f"{HF_FOLDER} has no weights: {SAVE_HF_HINT}")
    verdict = hf.inspect(directory / HF_FOLDER, weights)
    if verdict.readiness is Readiness.COMPLETE:
        return verdict
    return Verdict(verdict.readiness, f"{HF_FOLDER}: {verdict.reason}")


class VerlLayout(Layout):
    """A verl (FSDP) trainer's ``default_local_dir``; the candidate is ``global_step_N``."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        if folder_step(directory.name) is None:
            return False
        return (
            any(f.relpath.startswith("actor/") for f in snapshot.files)
            or (directory.parent / TRACKER_FILE).is_file()
        )

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        return inspect(directory, snapshot)

    def step(self, directory: Path) -> tuple[int | None, int | None]:
        return folder_step(directory.name), None

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        folder = directory / HF_FOLDER
        if not folder.is_dir():
            raise CheckpointInvalid(f"{directory}: no {HF_FOLDER}/ folder")
        if not has_weights(Snapshot(tuple(FileStat(p.name, 0, 0) for p in folder.iterdir()))):
            raise CheckpointInvalid(f"{folder}: no weights: {SAVE_HF_HINT}")
        return hf.as_safetensors(folder, scratch)
