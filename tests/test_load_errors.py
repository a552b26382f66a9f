"""A checkpoint whose content the libraries refuse at load is ``checkpoint_invalid`` at the first attempt
(issue 41), not a crash retried: the scan passes what it cannot read cheaply, and the loading boundary
turns the library's error about the content into :class:`CheckpointInvalid`, raised from it. Out of
memory and errors of our own keep their kinds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inference import layouts
from inference.errors import CheckpointInvalid
from inference.layouts import Readiness, take_snapshot
from inference.loader import _converting_errors, load_model
from inference.spec import InferenceSpec
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun


def _scan_passes(folder: Path) -> None:
    verdict = layouts.inspect(folder, take_snapshot(folder), "hf")
    assert verdict.readiness is Readiness.COMPLETE, verdict


def test_a_config_value_of_the_wrong_type_is_an_invalid_checkpoint(toy_run: ToyRun, tmp_path: Path) -> None:
    def stringly(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config["num_attention_heads"] = str(config["num_attention_heads"])
        (folder / "config.json").write_text(json.dumps(config))

    folder = copy_checkpoint(toy_run.last_checkpoint, tmp_path / "step_1", stringly)
    _scan_passes(folder)  # a string is no size the scanner reads: transformers' to judge
    with pytest.raises(CheckpointInvalid) as caught:
        load_model(folder, InferenceSpec(engine="hf", threads=1), scratch=tmp_path / "scratch")
    assert "cannot load the model" in str(caught.value) and "num_attention_heads" in str(caught.value)
    assert caught.value.__cause__ is not None  # raised from the library's own error


def test_a_tokenizer_the_tokenizers_library_refuses_is_an_invalid_checkpoint(
    toy_run: ToyRun, tmp_path: Path
) -> None:
    def unreadable(folder: Path) -> None:
        # transformers reads added_tokens itself; the rest is the tokenizers library's to parse.
        (folder / "tokenizer.json").write_text('{"version": "1.0", "added_tokens": [], "model": 5}')

    folder = copy_checkpoint(toy_run.last_checkpoint, tmp_path / "step_2", unreadable)
    _scan_passes(folder)  # strict JSON: only the tokenizers library knows it is no tokenizer
    with pytest.raises(CheckpointInvalid) as caught:
        load_model(folder, InferenceSpec(engine="hf", threads=1), scratch=tmp_path / "scratch")
    assert "cannot load the tokenizer" in str(caught.value)
    assert type(caught.value.__cause__) is Exception  # the library's bare Exception, kept as the cause


def test_out_of_memory_and_our_own_errors_keep_their_kinds(tmp_path: Path) -> None:
    with pytest.raises(torch.OutOfMemoryError), _converting_errors(tmp_path, "model"):
        raise torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(MemoryError), _converting_errors(tmp_path, "model"):
        raise MemoryError
    with pytest.raises(ZeroDivisionError), _converting_errors(tmp_path, "model"):
        raise ZeroDivisionError("a bug of ours")
    refused = pytest.raises(CheckpointInvalid, match="cannot load the tokenizer: recursion limit exceeded")
    with refused, _converting_errors(tmp_path, "tokenizer"):
        raise Exception("recursion limit exceeded")  # what the tokenizers library raises
