"""A real toy checkpoint (``save_pretrained`` of the toy model and tokenizer), saved once per process, for
scenarios whose writer copies checkpoints in rather than training (the kill scenario trains)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

_saved: dict[str, Path] = {}


def toy_checkpoint() -> Path:
    if "toy" not in _saved:
        from inference.toy.tokenizer import build_tokenizer
        from inference.toy.trainer import build_model

        folder = Path(tempfile.mkdtemp(prefix="evald-reliability-toy-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        tokenizer = build_tokenizer()
        build_model(tokenizer).save_pretrained(folder / "model")
        tokenizer.save_pretrained(folder / "model")
        _saved["toy"] = folder / "model"
    return _saved["toy"]


def write(root: Path, step: int) -> Path:
    """``root/step_N``, copied in file by file as a trainer writes it (no temporary name)."""
    target = root / f"step_{step}"
    shutil.copytree(toy_checkpoint(), target)
    return target
