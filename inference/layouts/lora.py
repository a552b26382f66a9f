"""PEFT LoRA adapters: ``adapter_model.safetensors`` + ``adapter_config.json``, merged into their base.

TRL, LLaMA-Factory and most RL fine-tuning with PEFT save only the adapter, often as the HF Trainer's
``checkpoint-N/`` (with ``trainer_state.json``, written last). ``PeftModel.save_pretrained`` writes the
weights first and ``adapter_config.json`` after them, so a folder is complete when the config parses,
the weights' header is whole (the ``save_pretrained`` rule) and, for a ``checkpoint-N``, the Trainer's
state names step N; the caller adds the quiet period.

The base model is ``runs[].base_model`` when set, else ``adapter_config.json``'s
``base_model_name_or_path`` if that is a local folder: this host never downloads models, so a Hub id
with no local copy is an invalid checkpoint whose reason names both keys. The worker merges the adapter
into the base (``PeftModel.from_pretrained(base, adapter).merge_and_unload()``) and saves the merged
model as safetensors in its scratch folder, so every engine (DeepSpeed AutoTP too) loads a plain
``save_pretrained`` folder. ``.bin`` weights are read with ``torch.load(weights_only=True)`` only.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from inference.errors import CheckpointInvalid
from inference.layouts import files, hf, hf_trainer
from inference.layouts.base import (
    Layout,
    LayoutSettings,
    Readiness,
    Shape,
    Snapshot,
    Verdict,
    parse_step,
    take_snapshot,
)

NAME = "lora"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_BIN = "adapter_model.bin"
#: Adapters that ``merge_and_unload`` folds into the base's own weights.
MERGEABLE = frozenset({"LORA"})
#: The keys an operator can set to name the base model, quoted in every reason about it.
BASE_KEYS = f"runs[].base_model or {ADAPTER_CONFIG}'s base_model_name_or_path"
#: Files of an adapter folder that are not the tokenizer's (the merged model writes its own config).
_NOT_TOKENIZER = frozenset(
    {ADAPTER_CONFIG, hf.CONFIG_FILE, "generation_config.json", hf_trainer.TRAINER_STATE}
)


def looks_like(snapshot: Snapshot) -> bool:
    """An adapter's own files at the folder's top, and no full weights beside them."""
    names = snapshot.names()
    adapter = bool({ADAPTER_CONFIG, ADAPTER_WEIGHTS, ADAPTER_BIN} & names)
    full = bool({hf.SINGLE_FILE, hf.INDEX_FILE, hf.BIN_SINGLE_FILE, hf.BIN_INDEX_FILE} & names)
    return adapter and not full


def weights_name(snapshot: Snapshot) -> str | None:
    names = snapshot.names()
    for name in (ADAPTER_WEIGHTS, ADAPTER_BIN):
        if name in names:
            return name
    return None


@dataclass(frozen=True)
class Base:
    """Where the base model is, or why it cannot be used."""

    path: Path | None
    problem: str | None = None


def find_base(configured: Path | None, adapter_config: dict[str, object]) -> Base:
    """The base model folder for an adapter (reads only whether folders exist)."""
    if configured is not None:
        if not (configured / hf.CONFIG_FILE).is_file():
            return Base(None, f"runs[].base_model {configured} has no {hf.CONFIG_FILE}")
        return Base(configured)
    named = adapter_config.get("base_model_name_or_path")
    if not isinstance(named, str) or not named.strip():
        return Base(
            None,
            f"{ADAPTER_CONFIG} names no base_model_name_or_path: set runs[].base_model to the base"
            " model's folder",
        )
    path = Path(named).expanduser()
    if path.is_absolute() and (path / hf.CONFIG_FILE).is_file():
        return Base(path)
    if path.is_absolute():
        return Base(
            None,
            f"base model {named!r} (from {ADAPTER_CONFIG}'s base_model_name_or_path) is not a model folder"
            f" here (no {hf.CONFIG_FILE}): set runs[].base_model to the base model's folder",
        )
    return Base(
        None,
        f"base model {named!r} (from {ADAPTER_CONFIG}'s base_model_name_or_path) is not a local folder and"
        " this host does not download models: set runs[].base_model to a local copy of it, or write its"
        f" local path in {ADAPTER_CONFIG}'s base_model_name_or_path",
    )


def parse_config(text: str | None) -> tuple[dict[str, object] | None, Verdict | None]:
    """The adapter config, or the verdict while it is not usable (pure)."""
    if text is None:
        return None, Verdict(
            Readiness.INCOMPLETE, f"no {ADAPTER_CONFIG} yet (PEFT writes it after the weights)"
        )
    try:
        config = files.parse_json(text, ADAPTER_CONFIG)
    except json.JSONDecodeError as exc:
        return None, Verdict(Readiness.INCOMPLETE, f"{ADAPTER_CONFIG} does not parse yet ({exc})")
    if not isinstance(config, dict):
        return None, Verdict(Readiness.INVALID, f"{ADAPTER_CONFIG} is not a JSON object")
    kind = config.get("peft_type", "LORA")
    if kind not in MERGEABLE:
        return None, Verdict(
            Readiness.INVALID,
            f"{ADAPTER_CONFIG} says peft_type {kind!r}: evald evaluates LoRA adapters (merged into their"
            " base); merge this one yourself and save_pretrained the result",
        )
    return config, None


def assess(
    snapshot: Snapshot,
    *,
    weights: str | None,
    header: hf.ShardHeader | None,
    config_text: str | None,
    state_problem: Verdict | None,
    base: Base | None,
) -> Verdict:
    """Readiness of an adapter folder from its files and the base found for it (pure).

    ``base`` is ``None`` until the config is usable (it is read from there); ``state_problem`` is the HF
    Trainer's verdict on ``trainer_state.json`` for a ``checkpoint-N`` (``None``: finished, or no Trainer).
    """
    if state_problem is not None:
        return state_problem
    if weights is None:
        return Verdict(Readiness.INCOMPLETE, f"no {ADAPTER_WEIGHTS} (or {ADAPTER_BIN}) yet")
    unwhole = hf.shard_verdict(weights, header, snapshot.size(weights))
    if unwhole is not None:
        return unwhole
    _, problem = parse_config(config_text)
    if problem is not None:
        return problem
    if base is None or base.path is None:
        problem_text = base.problem if base is not None and base.problem else f"no base model ({BASE_KEYS})"
        return Verdict(Readiness.INVALID, problem_text)
    return Verdict.complete()


def _read_small(path: Path) -> str | None:
    # A FIFO, a device or a huge file is refused (FileRefused), never opened blocking or read whole.
    return files.read_text(path, errors="replace")


def inspect(directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
    """Read what :func:`assess` needs from ``directory`` (I/O edge) and judge it."""
    step = hf_trainer.folder_step(directory.name)
    state = None
    if step is not None:
        state = hf_trainer.state_problem(step, _read_small(directory / hf_trainer.TRAINER_STATE))
    weights = weights_name(snapshot)
    header = None
    if weights is not None:
        read = hf.read_torch_zip_end if hf.is_bin(weights) else hf.read_shard_header
        try:
            header = read(directory / weights)
        except FileNotFoundError:
            header = None
    config_text = _read_small(directory / ADAPTER_CONFIG)
    config, _ = parse_config(config_text)
    base = find_base(settings.base_model, config) if config is not None else None
    return assess(
        snapshot, weights=weights, header=header, config_text=config_text, state_problem=state, base=base
    )


def _adapter_folder(directory: Path, scratch: Path) -> Path:
    """``directory`` when its weights are safetensors; else a copy with them converted (no pickle runs)."""
    if not (directory / ADAPTER_BIN).is_file() or (directory / ADAPTER_WEIGHTS).is_file():
        return directory
    target = scratch / "adapter"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(directory / ADAPTER_CONFIG, target / ADAPTER_CONFIG)
    from safetensors.torch import save_file

    state = hf.load_torch_file(directory / ADAPTER_BIN)
    save_file({k: v.contiguous() for k, v in state.items()}, str(target / ADAPTER_WEIGHTS))
    return target


def _copy_tokenizer(source: Path, target: Path) -> None:
    for path in sorted(source.iterdir()):
        name = path.name
        side = name.endswith(hf.SIDE_FILE_SUFFIXES) and not name.endswith(".index.json")
        if side and name not in _NOT_TOKENIZER and path.is_file():
            shutil.copyfile(path, target / name)


def merge(directory: Path, base: Path, scratch: Path) -> Path:
    """The adapter in ``directory`` merged into ``base``, saved as ``save_pretrained`` safetensors in
    ``scratch/merged`` with the base's tokenizer, or the adapter folder's own where it has one."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_folder = hf.as_safetensors(base, scratch / "base")
    verdict = hf.inspect(base_folder, take_snapshot(base_folder))
    if verdict.readiness is not Readiness.COMPLETE:
        raise CheckpointInvalid(f"base model {base}: {verdict.reason}")
    model = AutoModelForCausalLM.from_pretrained(
        base_folder, use_safetensors=True, local_files_only=True, trust_remote_code=False
    )
    try:
        merged = PeftModel.from_pretrained(model, _adapter_folder(directory, scratch)).merge_and_unload()
    except (ValueError, RuntimeError, KeyError) as exc:
        message = " ".join(str(exc).split())
        raise CheckpointInvalid(
            f"{directory}: cannot merge the adapter into base model {base}: {message}"
        ) from exc
    target = scratch / "merged"
    target.mkdir(parents=True, exist_ok=True)
    hf.copy_side_files(base_folder, target)
    _copy_tokenizer(directory, target)
    merged.save_pretrained(target, safe_serialization=True)
    return target


class LoraLayout(Layout):
    """A PEFT LoRA adapter folder (plain, or a Trainer's ``checkpoint-N``), merged into its base."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        return looks_like(snapshot)

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        return inspect(directory, snapshot, settings)

    def step(self, directory: Path) -> tuple[int | None, int | None]:
        step = hf_trainer.folder_step(directory.name)
        return (step, None) if step is not None else parse_step(directory.name)

    def shape(self, directory: Path) -> Shape:
        return Shape.RESUMABLE if hf_trainer.folder_step(directory.name) is not None else Shape.HF_EXPORT

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        text = _read_small(directory / ADAPTER_CONFIG)
        config, problem = parse_config(text)
        if config is None:
            raise CheckpointInvalid(f"{directory}: {problem.reason if problem else ADAPTER_CONFIG}")
        base = find_base(settings.base_model, config)
        if base.path is None:
            raise CheckpointInvalid(f"{directory}: {base.problem}")
        return merge(directory, base.path, scratch)
