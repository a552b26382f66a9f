"""Where a tensor-only checkpoint's model config (``config.json`` and tokenizer files) is found.

DeepSpeed engine, DCP and OpenRLHF actor checkpoints hold only tensors, but trainers usually save the
model's config beside them: the HF Trainer writes ``config.json`` into ``checkpoint-N/`` next to
``global_stepN/``, training scripts save it into the DeepSpeed ``save_dir`` or the run folder, and some
put it into the checkpoint folder itself. So the config folder is, in this order:

1. ``runs[].hf_config`` when set (an explicit choice always wins; it must hold ``config.json``);
2. the checkpoint folder itself;
3. each parent folder up to the top of the run: the run's ``root`` when the checkpoint lies under it,
   else (``evald eval``, a base model outside the root) the layout's own save folder, the one the trainer
   saved into (a DeepSpeed ``save_dir``, OpenRLHF's ``CKPT``), whichever of the two reaches higher;
4. places a layout adds (OpenRLHF's ``global_stepN_hf`` saved with the same step).

Nothing above the run is looked at: an unrelated ``config.json`` higher up must not describe the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from inference.errors import CheckpointInvalid

CONFIG_FILE = "config.json"
SET_HF_CONFIG = "set runs[].hf_config to a folder with the model's config.json and tokenizer files"

log = structlog.get_logger("inference.layouts")


def search_path(checkpoint: Path, run_root: Path | None, save_root: Path) -> tuple[Path, ...]:
    """The folders that may hold ``checkpoint``'s ``config.json``, nearest first (pure, no I/O).

    ``checkpoint`` itself, then its parents up to the highest of ``run_root`` and ``save_root`` that
    contains it (a root that does not contain the checkpoint is not a root of it).
    """
    tops = [root for root in (run_root, save_root) if root is not None and checkpoint.is_relative_to(root)]
    top = min(tops, key=lambda root: len(root.parts), default=checkpoint)
    folders = [checkpoint]
    while folders[-1] != top and folders[-1].parent != folders[-1]:
        folders.append(folders[-1].parent)
    return tuple(folders)


def config_folder(
    checkpoint: Path,
    hf_config: Path | None,
    run_root: Path | None,
    *,
    save_root: Path,
    holds_only: str,
    also: Sequence[Path] = (),
) -> Path:
    """The folder whose ``config.json`` and tokenizer files go with ``checkpoint``'s tensors.

    ``holds_only`` starts the error (``"a DCP checkpoint holds only tensors"``); ``also`` lists the
    layout's own places, looked at after the walk up. Raises :class:`CheckpointInvalid` naming
    ``runs[].hf_config`` when it is set without a ``config.json``, and every folder looked at when
    none holds one.
    """
    if hf_config is not None:
        if not (hf_config / CONFIG_FILE).is_file():
            raise CheckpointInvalid(
                f"{hf_config}: no {CONFIG_FILE} (runs[].hf_config must name the model's config folder)"
            )
        return hf_config
    run_top = run_root.absolute() if run_root is not None else None
    places = (*search_path(checkpoint.absolute(), run_top, save_root.absolute()), *also)
    for place in places:
        if (place / CONFIG_FILE).is_file():
            log.info("checkpoint.config_found", checkpoint=str(checkpoint), folder=str(place))
            return place
    looked = ", ".join(f"{place}/ has no {CONFIG_FILE}" for place in places)
    raise CheckpointInvalid(f"{checkpoint}: {holds_only}; {looked}; {SET_HF_CONFIG}")
