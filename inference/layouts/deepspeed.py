"""DeepSpeed engine checkpoints: ``save_checkpoint(save_dir)`` writes ``save_dir/<tag>/``, then ``latest``.

Write order (``deepspeed/runtime/engine.py``, ``save_checkpoint``): the model states (one
``mp_rank_XX_model_states.pt`` for ZeRO 0-2, one ``zero_pp_rank_R_mp_rank_XX_model_states.pt`` per rank for
ZeRO-3), every rank's ``*_optim_states.pt``, a barrier, and only then rank 0 writes the tag into
``save_dir/latest``. So a tag folder is committed once ``latest`` names it, or names a later tag (DeepSpeed
moves ``latest`` forward and leaves older tags whole).

The number of optimizer shards is the data-parallel world size. DeepSpeed's own ``zero_to_fp32`` reads it
from inside the optimizer pickles (``partition_count``); the daemon must not unpickle, so it takes
``dp_world_size`` from the rank-0 model-states file's pickle opcodes (see :mod:`inference.layouts.torch_zip`),
and expects one shard per data-parallel rank and model-parallel rank.

Weights are consolidated in the worker with ``deepspeed.utils.zero_to_fp32``, DeepSpeed's own code. It
calls ``torch.load(..., weights_only=False)``; evald forces ``weights_only=True`` around it (PyTorch's
``TORCH_FORCE_WEIGHTS_ONLY_LOAD``) and allows only DeepSpeed's plain data classes, so a pickle that would
run code is refused instead of executed.
"""

from __future__ import annotations

import os
import pickle
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inference.errors import CheckpointInvalid, FileRefused
from inference.layouts import files, hf, model_config, torch_zip, unpickling
from inference.layouts.base import (
    Layout,
    LayoutSettings,
    Readiness,
    Snapshot,
    Verdict,
    parse_step,
    take_snapshot,
)

if TYPE_CHECKING:
    import torch

NAME = "deepspeed"
LATEST = "latest"
#: The rank-0 model-states file of ZeRO 0-2, then of ZeRO-3 (which partitions the weights).
RANK0_STATES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")
_STATES = re.compile(
    r"(?:zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt|(?:bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt"
)
_WORLD_KEYS = frozenset({"dp_world_size", "mp_world_size"})
CONSOLIDATED = "consolidated"


def commit_problem(name: str, latest_text: str | None) -> str | None:
    """Why the tag folder ``name`` is not committed by ``latest`` yet, or ``None`` when it is (pure)."""
    if latest_text is None:
        return f"no {LATEST} file beside it yet (DeepSpeed writes it after every shard)"
    tag = latest_text.strip()
    if tag == name:
        return None
    step, _ = parse_step(name)
    latest_step, _ = parse_step(tag)
    if step is not None and latest_step is not None and latest_step > step:
        return None  # an older tag: latest only moves on once this one was whole
    return f"{LATEST} names {tag!r}, not {name!r}: this checkpoint is not committed"


@dataclass(frozen=True)
class Shards:
    """The files a tag folder must hold, given its rank-0 model-states file and world sizes."""

    model_states: tuple[str, ...]
    #: Per (dp rank, mp rank): the accepted names (``bf16_`` prefix when bf16 without ZeRO).
    optim_states: tuple[tuple[str, ...], ...]


def expected_shards(rank0: str, dp_world_size: int, mp_world_size: int) -> Shards:
    """The shard names DeepSpeed writes for these world sizes (pure; ``engine._get_ckpt_name``)."""
    partitioned = rank0 == RANK0_STATES[1]
    model: list[str] = []
    optim: list[tuple[str, ...]] = []
    for mp in range(mp_world_size):
        if not partitioned:
            model.append(f"mp_rank_{mp:02d}_model_states.pt")
        for dp in range(dp_world_size):
            if partitioned:
                model.append(f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt")
            name = f"zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt"
            optim.append((name, f"bf16_{name}"))
    return Shards(tuple(model), tuple(optim))


def is_stage0(rank0: str, names: frozenset[str]) -> bool:
    """A committed tag folder without ZeRO (stage 0): DeepSpeed kept the optimizer inside the model
    states and wrote no optimizer shard at all (pure).

    Only meaningful once ``latest`` commits the folder: DeepSpeed writes ``latest`` after a barrier that
    follows every rank's shards, so a committed folder with no ``*optim_states.pt`` has none to wait for.
    (bf16 without ZeRO still writes ``bf16_*optim_states.pt`` shards, so it is not taken for stage 0.)
    """
    return rank0 == RANK0_STATES[0] and not any(name.endswith("optim_states.pt") for name in names)


def missing_shard(shards: Shards, names: frozenset[str]) -> str | None:
    """The first shard not in ``names`` (pure)."""
    for name in shards.model_states:
        if name not in names:
            return name
    for choices in shards.optim_states:
        if not names.intersection(choices):
            return choices[0]
    return None


@files.judged
def inspect(directory: Path, snapshot: Snapshot) -> Verdict:
    """Readiness of a tag folder from ``latest``, its shards' names and their zip trailers (I/O edge)."""
    latest = files.read_text(directory.parent / LATEST, limit=files.MAX_TAG_BYTES, errors="replace")
    problem = commit_problem(directory.name, latest)
    if problem is not None:
        return Verdict(Readiness.INCOMPLETE, problem)
    names = snapshot.names()
    rank0 = next((name for name in RANK0_STATES if name in names), None)
    if rank0 is None:
        return Verdict(Readiness.INCOMPLETE, f"no {RANK0_STATES[0]} or {RANK0_STATES[1]}")
    unfinished = _unfinished(directory, rank0)
    if unfinished is not None:
        return unfinished
    try:
        probe = torch_zip.probe(directory / rank0, _WORLD_KEYS)
    except FileNotFoundError:
        return Verdict(Readiness.INCOMPLETE, f"{rank0} disappeared while being read")
    if probe.problem is not None:
        return Verdict(Readiness.INVALID, f"{rank0}: {probe.problem}")
    dp, mp = probe.integers.get("dp_world_size"), probe.integers.get("mp_world_size", 1)
    if dp is None or dp < 1 or mp < 1:
        return Verdict(Readiness.INVALID, f"{rank0} records no usable dp_world_size")
    shards = expected_shards(rank0, dp, mp)
    if is_stage0(rank0, names):
        missing_states = next((n for n in shards.model_states if n not in names), None)
        if missing_states is not None:
            return Verdict(Readiness.INCOMPLETE, f"{missing_states} is missing (mp_world_size {mp})")
        unfinished = next((u for n in shards.model_states if (u := _unfinished(directory, n))), None)
        return unfinished or Verdict.complete()
    missing = missing_shard(shards, names)
    if missing is not None:
        return Verdict(
            Readiness.INCOMPLETE,
            f"{missing} is missing ({rank0} records dp_world_size {dp}, mp_world_size {mp})",
        )
    present = [*shards.model_states, *(n for c in shards.optim_states for n in c if n in names)]
    for name in present:
        unfinished = _unfinished(directory, name) if name != rank0 else None
        if unfinished is not None:
            return unfinished
    return Verdict.complete()


def _unfinished(directory: Path, name: str) -> Verdict | None:
    """Why the ``torch.save`` file ``name`` is not whole yet (its zip end record comes last), if it is not."""
    try:
        header = hf.read_torch_zip_end(directory / name)
    except FileNotFoundError:
        return Verdict(Readiness.INCOMPLETE, f"{name} disappeared while being read")
    if header.problem is None:
        return None
    return Verdict(
        Readiness.INCOMPLETE if header.maybe_partial else Readiness.INVALID, f"{name}: {header.problem}"
    )


def latest_tag(directory: Path) -> Path | None:
    """The tag folder that ``directory/latest`` names, when ``directory`` is an engine ``save_dir``
    (what ``save_checkpoint`` was given: OpenRLHF's ``_actor``); ``None`` otherwise. Raises
    :class:`FileRefused` when ``latest`` is there but not a small regular file."""
    text = files.read_text(directory / LATEST, limit=files.MAX_TAG_BYTES, errors="replace")
    tag = text.strip() if text is not None else ""
    if not tag or tag in (".", "..") or "/" in tag or os.sep in tag:
        return None
    folder = directory / tag
    return folder if folder.is_dir() else None


def _tag_layout(tag: Path) -> Layout:
    """The layout that reads ``tag`` (OpenRLHF's for ``_actor/global_stepN``, this one otherwise)."""
    from inference import layouts

    name = layouts.detect(tag, take_snapshot(tag), "auto")
    return layouts.get(name) if name is not None and name != "hf" else DeepSpeedLayout()


def looks_like(directory: Path, snapshot: Snapshot) -> bool:
    if any(_STATES.fullmatch(name) for name in snapshot.names()):
        return True
    return (
        re.fullmatch(r"global_step\d+", directory.name) is not None and (directory.parent / LATEST).is_file()
    )


@contextmanager
def _weights_only_loads() -> Iterator[None]:
    """Every ``torch.load`` inside runs with ``weights_only=True``, whatever its caller asked for.

    Besides tensors and containers, DeepSpeed's optimizer pickles hold three plain data classes (the ZeRO
    stage enum, the loss scaler's settings, a fragment's offsets); they are allowed, nothing else is, but
    for ``builtins.getattr`` read as an enum member by name (:mod:`inference.layouts.unpickling`).
    Not thread-safe (it sets an environment variable), which suits the single-threaded worker.
    """
    import torch
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    variable = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(variable)
    os.environ[variable] = "1"
    try:
        with torch.serialization.safe_globals(
            [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address, unpickling.AS_GETATTR]
        ):
            yield
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before


def consolidated_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """fp32 weights of a ZeRO checkpoint tag folder, gathered by DeepSpeed's ``zero_to_fp32``.

    Raises :class:`CheckpointInvalid` naming the folder when DeepSpeed cannot read it or a pickle needs
    more than tensors; ``FileNotFoundError`` passes through (the loader reports a vanished checkpoint).
    """
    # DeepSpeed logs to stdout (from its import on) and zero_to_fp32 prints progress; stdout is not ours.
    with redirect_stdout(sys.stderr):
        return _gathered(directory)


def _stage0_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Without ZeRO the whole model is the ``module`` entry of the rank-0 model states."""
    import torch

    state = torch.load(directory / RANK0_STATES[0], map_location="cpu", weights_only=True)
    module = state.get("module") if isinstance(state, dict) else None
    if not isinstance(module, dict):
        raise CheckpointInvalid(f"{directory / RANK0_STATES[0]}: no 'module' state dict inside")
    return {name: tensor.float() for name, tensor in module.items() if isinstance(tensor, torch.Tensor)}


def _gathered(directory: Path) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    names = take_snapshot(directory).names()
    try:
        with _weights_only_loads():
            if is_stage0(RANK0_STATES[0] if RANK0_STATES[0] in names else "", names):
                return _stage0_weights(directory)
            state: dict[str, torch.Tensor] = get_fp32_state_dict_from_zero_checkpoint(
                str(directory.parent), tag=directory.name
            )
    except pickle.UnpicklingError as exc:
        reason = unpickling.refusal(exc)
        raise CheckpointInvalid(
            f"{directory}: refused to unpickle a shard that holds more than tensors: {reason}"
        ) from exc
    except FileNotFoundError:
        raise
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        raise CheckpointInvalid(
            f"{directory}: DeepSpeed's zero_to_fp32 cannot consolidate it: {exc}"
        ) from exc
    return state


def config_folder(directory: Path, settings: LayoutSettings) -> Path:
    """The model config folder of engine checkpoint ``directory``: ``hf_config``, or beside it up to the
    run root; the engine's ``save_dir`` (where ``latest`` lives) is the top when the root is unknown."""
    return model_config.config_folder(
        directory,
        settings.hf_config,
        settings.run_root,
        save_root=directory.parent,
        holds_only="a DeepSpeed checkpoint holds only tensors",
    )


def consolidate(directory: Path, hf_config: Path, scratch: Path) -> Path:
    """Turn a committed tag folder into a loadable ``save_pretrained`` folder under ``scratch``."""
    verdict = inspect(directory, take_snapshot(directory))
    if verdict.readiness is not Readiness.COMPLETE:
        raise CheckpointInvalid(f"{directory}: {verdict.reason}")
    target = scratch / CONSOLIDATED
    hf.copy_side_files(hf_config, target)
    hf.write_safetensors(consolidated_state_dict(directory), target)
    return target


class DeepSpeedLayout(Layout):
    """``global_stepN/`` written by ``DeepSpeedEngine.save_checkpoint``, committed by ``latest`` beside it."""

    name = NAME

    # A save_dir (the folder holding ``latest``) is read as the tag ``latest`` names, so that
    # ``evald eval _actor`` evaluates the newest committed step instead of finding no weights.

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        if looks_like(directory, snapshot):
            return True
        try:
            return latest_tag(directory) is not None
        except FileRefused:
            return True  # a save_dir whose ``latest`` cannot be read: inspect names what it is

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        try:
            tag = latest_tag(directory) if not looks_like(directory, snapshot) else None
        except FileRefused as exc:
            return files.refusal(directory, exc)
        if tag is not None:
            verdict = _tag_layout(tag).inspect(tag, take_snapshot(tag), settings)
            return Verdict(verdict.readiness, f"{LATEST} names {tag.name}: {verdict.reason}")
        return inspect(directory, snapshot)

    def step(self, directory: Path) -> tuple[int | None, int | None]:
        try:
            tag = latest_tag(directory) if not looks_like(directory, take_snapshot(directory)) else None
        except FileRefused:
            tag = None  # inspect refuses the folder; its name still gives the step it is recorded under
        return super().step(tag if tag is not None else directory)

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        tag = latest_tag(directory) if not looks_like(directory, take_snapshot(directory)) else None
        if tag is not None:
            return _tag_layout(tag).materialise(tag, settings, scratch)
        return consolidate(directory, config_folder(directory, settings), scratch)
