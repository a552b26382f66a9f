"""OpenRLHF checkpoints: ``CKPT/_actor/global_stepN/`` (DeepSpeed engine) and ``CKPT/global_stepN_hf/``.

Followed from OpenRLHF's source: ``openrlhf/trainer/ray/ppo_actor.py`` (``PolicyModelActor.save_checkpoint``)
calls ``strategy.save_ckpt(actor.model, CKPT/_actor, tag)`` with ``tag = f"global_step{N}"``
(``openrlhf/trainer/ppo_trainer.py``), which is ``engine.save_checkpoint(CKPT/_actor, tag=tag)``
(``openrlhf/utils/deepspeed/deepspeed.py``, ``save_ckpt``; it first deletes the oldest folders beyond
``--max_ckpt_num``), so ``latest`` lives in ``_actor/``. With ``--save_hf_ckpt`` it then calls
``strategy.save_model`` into ``CKPT/global_stepN_hf``: rank 0 runs ``save_pretrained`` (config, weights),
rewrites ``config.json`` and saves the tokenizer last, with no marker.

``_critic/`` and ``_ema/`` hold engine checkpoints too (the value model, the actor's moving average); they
are not the policy being trained and are recognised only to say so instead of being evaluated as one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from inference.errors import CheckpointInvalid
from inference.layouts import deepspeed, files, hf, model_config
from inference.layouts.base import Layout, LayoutSettings, Readiness, Shape, Snapshot, Verdict

NAME = "openrlhf"
ACTOR = "_actor"
#: Engine checkpoints OpenRLHF keeps beside the actor's; never the policy.
NOT_POLICY = ("_critic", "_ema")
TOKENIZER_CONFIG = "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"
_TAG = re.compile(r"global_step\d+")
_HF_FOLDER = re.compile(r"(global_step\d+)_hf")


def tokenizer_problem(config_text: str | None, tokenizer_text: str | None) -> str | None:
    """Why the tokenizer, which ``save_model`` writes last, is not whole yet (pure).

    ``tokenizer.save_pretrained`` writes ``tokenizer_config.json`` and then, for a ``tokenizers``-backed
    tokenizer (transformers' default), ``tokenizer.json``. Raises :class:`FileRefused` for one nested too
    deep to parse.
    """
    if config_text is None:
        return f"no {TOKENIZER_CONFIG} yet (OpenRLHF saves the tokenizer last)"
    try:
        config = files.parse_json(config_text, TOKENIZER_CONFIG)
    except json.JSONDecodeError as exc:
        return f"{TOKENIZER_CONFIG} does not parse yet ({exc})"
    backend = config.get("backend", "tokenizers") if isinstance(config, dict) else "tokenizers"
    if backend != "tokenizers":
        return None
    if tokenizer_text is None:
        return f"no {TOKENIZER_FILE} yet ({TOKENIZER_CONFIG} names the tokenizers backend)"
    try:
        files.parse_json(tokenizer_text, TOKENIZER_FILE)
    except json.JSONDecodeError as exc:
        return f"{TOKENIZER_FILE} does not parse yet ({exc})"
    return None


@files.judged
def inspect_hf(directory: Path, snapshot: Snapshot) -> Verdict:
    problem = tokenizer_problem(
        files.read_text(directory / TOKENIZER_CONFIG) if TOKENIZER_CONFIG in snapshot.names() else None,
        files.read_text(directory / TOKENIZER_FILE) if TOKENIZER_FILE in snapshot.names() else None,
    )
    if problem is not None:
        return Verdict(Readiness.INCOMPLETE, problem)
    return hf.inspect(directory, snapshot)


def is_actor(directory: Path) -> bool:
    return directory.parent.name == ACTOR and _TAG.fullmatch(directory.name) is not None


def is_not_policy(directory: Path) -> bool:
    return directory.parent.name in NOT_POLICY and _TAG.fullmatch(directory.name) is not None


def actor_hf_config(directory: Path, settings: LayoutSettings) -> Path:
    """``runs[].hf_config`` if set; else a ``config.json`` beside the actor up to the run root (``CKPT``,
    above ``_actor/``, when the root is unknown); else the one saved in the same tag's ``_hf`` folder."""
    ckpt = directory.parent.parent
    return model_config.config_folder(
        directory,
        settings.hf_config,
        settings.run_root,
        save_root=ckpt,
        holds_only="an OpenRLHF actor checkpoint holds only tensors",
        also=(ckpt / f"{directory.name}_hf",),
    )


class OpenRlhfLayout(Layout):
    """OpenRLHF's actor engine checkpoints and its ``--save_hf_ckpt`` folders."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        return (
            is_actor(directory)
            or is_not_policy(directory)
            or _HF_FOLDER.fullmatch(directory.name) is not None
        )

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        if is_actor(directory):
            return deepspeed.inspect(directory, snapshot)
        if is_not_policy(directory):
            return Verdict(
                Readiness.INVALID,
                f"OpenRLHF {directory.parent.name} state, not the policy: its weights are in "
                f"{ACTOR}/{directory.name} and {directory.name}_hf",
            )
        return inspect_hf(directory, snapshot)

    def shape(self, directory: Path) -> Shape:
        return Shape.RESUMABLE if is_actor(directory) or is_not_policy(directory) else Shape.HF_EXPORT

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        if is_actor(directory):
            return deepspeed.consolidate(directory, actor_hf_config(directory, settings), scratch)
        if is_not_policy(directory):
            raise CheckpointInvalid(f"{directory}: OpenRLHF {directory.parent.name} state is not the policy")
        return hf.as_safetensors(directory, scratch)
