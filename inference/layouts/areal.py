"""AReaL: ``…/{name}/epoch{E}epochstep{S}globalstep{G}/`` holding a ``save_pretrained`` model.

The folder name comes from ``areal/utils/saver.py`` (``Saver.get_save_checkpoint_path``:
``{fileroot}/checkpoints/{user}/{experiment}/{trial}/{name}/epoch{epoch}epochstep{step}globalstep{globalstep}``,
created before anything is written). Into it ``areal/engine/fsdp_engine.py`` (``_save_model_to_hf``) writes,
on rank 0 and with no marker: ``model.save_pretrained`` (``config.json``, ``generation_config.json``, the
safetensors weights), ``model_config.save_pretrained`` (``config.json`` again), then
``tokenizer.save_pretrained`` (``tokenizer_config.json``, ``tokenizer.json`` last).

So the weights being whole is not the end: the tokenizer follows them. A checkpoint is complete when the
``save_pretrained`` rule holds and ``tokenizer.json`` parses; the caller's quiet period covers the rest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from inference.layouts import files, hf
from inference.layouts.base import Layout, LayoutSettings, Readiness, Shape, Snapshot, Verdict

NAME = "areal"
FOLDER = re.compile(r"epoch(\d+)epochstep(\d+)globalstep(\d+)")
TOKENIZER_FILE = "tokenizer.json"


def folder_step(name: str) -> tuple[int | None, int | None]:
    """(global step, epoch) from an AReaL folder name."""
    match = FOLDER.fullmatch(name)
    if match is None:
        return None, None
    return int(match.group(3)), int(match.group(1))


def assess_tokenizer(snapshot: Snapshot, tokenizer_text: str | None) -> Verdict:
    """Whether the tokenizer AReaL writes after the weights is whole (pure; raises :class:`FileRefused`
    for one nested too deep to parse)."""
    if TOKENIZER_FILE not in snapshot.names() or tokenizer_text is None:
        return Verdict(Readiness.INCOMPLETE, f"no {TOKENIZER_FILE} yet (AReaL writes the tokenizer last)")
    try:
        files.parse_json(tokenizer_text, TOKENIZER_FILE)
    except json.JSONDecodeError:
        return Verdict(Readiness.INCOMPLETE, f"{TOKENIZER_FILE} is not whole JSON yet")
    return Verdict.complete()


@files.judged
def inspect(directory: Path, snapshot: Snapshot) -> Verdict:
    verdict = hf.inspect(directory, snapshot)
    if verdict.readiness is not Readiness.COMPLETE:
        return verdict
    return assess_tokenizer(snapshot, files.read_text(directory / TOKENIZER_FILE))


class ArealLayout(Layout):
    """AReaL's periodic ``save_pretrained`` checkpoints, named by epoch, epoch step and global step."""

    name = NAME

    def recognise(self, directory: Path, snapshot: Snapshot) -> bool:
        return FOLDER.fullmatch(directory.name) is not None

    def inspect(self, directory: Path, snapshot: Snapshot, settings: LayoutSettings) -> Verdict:
        return inspect(directory, snapshot)

    def step(self, directory: Path) -> tuple[int | None, int | None]:
        return folder_step(directory.name)

    def shape(self, directory: Path) -> Shape:
        return Shape.HF_EXPORT

    def materialise(self, directory: Path, settings: LayoutSettings, scratch: Path) -> Path:
        return hf.as_safetensors(directory, scratch)
