"""``transformers.Trainer`` checkpoints: ``checkpoint-N/``, finished by ``trainer_state.json``.

Write order (``transformers/trainer.py``, ``Trainer._save_checkpoint``): ``save_model`` (``config.json``,
weights, tokenizer files, ``training_args.bin``), then optimizer, scheduler and RNG states, and
``trainer_state.json`` last. So a folder is complete when its weights pass the ``save_pretrained`` rules
and ``trainer_state.json`` parses with ``global_step`` equal to the ``N`` in the folder's name.

With DeepSpeed, ``save_model`` may leave no weights at all (ZeRO-3 without
``stage3_gather_16bit_weights_on_model_save``): then ``engine.save_checkpoint`` wrote ``global_stepN/`` and
``latest`` inside the checkpoint folder, the DeepSpeed rules apply there, and the weights are consolidated
from it with the folder's own ``config.json``. ``tmp-checkpoint-*`` folders are ignored by name upstream.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from inference.errors import CheckpointInvalid
from inference.layouts import deepspeed, files, hf, model_config
from inference.layouts.base import Layout, LayoutSettings, Readiness, Snapshot, Verdict, take_snapshot

NAME = "hf_trainer"
TRAINER_STATE = "trainer_state.json"
_FOLDER = re.compile(r"checkpoint-(\d+)")


def folder_step(name: str) -> int | None:
    match = _FOLDER.fullmatch(name)
    return int(match.group(1)) if match else None


def state_problem(step: int, state_text: str | None) -> Verdict | None:
    """Why ``trainer_state.json`` does not finish checkpoint ``step`` yet, or ``None`` when it does (pure).

    Raises :class:`FileRefused` when it is nested too deep to parse.
    """
    if state_text is None:
        return Verdict(Readiness.INCOMPLETE, f"no {TRAINER_STATE} yet (the Trainer writes it last)")
    try:
        # log_history of a diverging run holds NaN losses and grad norms: a good checkpoint to evaluate.
        state = files.parse_json(state_text, TRAINER_STATE, allow_nan=True)
    except json.JSONDecodeError as exc:
        return Verdict(Readiness.INCOMPLETE, f"{TRAINER_STATE} does not parse yet ({exc})")
    recorded = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(recorded, int) or isinstance(recorded, bool):
        return Verdict(Readiness.INVALID, f"{TRAINER_STATE} has no integer global_step")
    if recorded != step:
        return Verdict(
            Readiness.INVALID,
            f"{TRAINER_STATE} says global_step {recorded}, but the folder is checkpoint-{step}",
        )
    return None


def has_weights(snapshot: Snapshot) -> bool:
    """Whether ``save_model`` left weights in the folder itself (always, unless DeepSpeed kept them)."""
    return bool({hf.SINGLE_FILE, hf.INDEX_FILE, hf.BIN_SINGLE_FILE, hf.BIN_INDEX_FILE} & snapshot.names())


def engine_tag(snapshot: Snapshot) -> bool:
    """Whether the Trainer handed the weights to DeepSpeed (``latest`` or a tag folder is there)."""
    return any(name == deepspeed.LATEST or name.startswith("global_step") for name in snapshot.names())


def _tag_folder(directory: Path) -> Path | None:
    text = files.read_text(directory / deepspeed.LATEST, limit=files.MAX_TAG_BYTES, errors="replace")
    if text is None:
        return None
    tag = text.strip()
    return directory / tag if tag and "/" not in tag and tag not in (".", "..") else None


def _tag_snapshot(snapshot: Snapshot, tag: str) -> Snapshot:
    prefix = f"{tag}/"
    inner = tuple(
        replace(stat, relpath=stat.relpath[len(prefix) :])
        for stat in snapshot.files
        if stat.relpath.startswith(prefix)
    )
    return Snapshot(inner)


@files.judged
def inspect(directory: Path, snapshot: Snapshot) -> Verdict:
    step = folder_step(directory.name)
    if step is None:
        return Verdict(Readiness.INVALID, f"{directory.name} is not named checkpoint-N")
    state_text = files.read_text(directory / TRAINER_STATE, errors="replace")
    problem = state_problem(step, state_text)
    if problem is not None:
        return problem
    if has_weights(snapshot) or not engine_tag(snapshot):
        return hf.inspect(directory, snapshot)
    if hf.CONFIG_FILE not in snapshot.names():
        return Verdict(Readiness.INCOMPLETE, f"no {hf.CONFIG_FILE}")
    tag = _tag_folder(directory)
    if tag is None:
        return Verdict(Readiness.INCOMPLETE, f"no {deepspeed.LATEST} naming the DeepSpeed tag folder")
    inner = _tag_snapshot(snapshot, tag.name)
    if not inner.files:
        return Verdict(
            Readiness.INCOMPLETE, f"{deepspeed.LATEST} names {tag.name!r}, which holds no files here"
        )
    verdict = deepspeed.inspect(tag, inner)
    return (
        Verdict(verdict.readiness, f"{tag.name}/: {verdict.reason}")
        if verdict.reason != "complete"
        else verdict
    )


class HfTrainerLayout(Layout):
    """``checkpoint-N/`` as ``transformers.Trainer`` saves it, with or without DeepSpeed."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        return folder_step(directory.name) is not None

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        return inspect(directory, snapshot)

    def step(self, directory: Path) -> tuple[int | None, int | None]:
        return folder_step(directory.name), None

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        snapshot = take_snapshot(directory)
        if has_weights(snapshot) or not engine_tag(snapshot):
            return hf.as_safetensors(directory, scratch)
        tag = _tag_folder(directory)
        if tag is None:
            raise CheckpointInvalid(
                f"{directory}: no weights and no {deepspeed.LATEST} naming a DeepSpeed tag"
            )
        # Readiness asked for config.json in checkpoint-N/ itself, so without hf_config that is the one used.
        config = model_config.config_folder(
            directory,
            settings.hf_config,
            settings.run_root,
            save_root=directory,
            holds_only="the Trainer left the weights to DeepSpeed",
        )
        return deepspeed.consolidate(tag, config, scratch)
