"""Every layout's real writer output is found beside the files real tools leave next to checkpoints
(issue 23): DeepSpeed's recovery scripts, ``latest``, RNG states, ``trainer_state.json``, ``.metadata``,
READMEs, ``wandb/`` folders, ``.nfs*`` and ``.tmp`` files. None of them may turn a folder holding
checkpoints into a checkpoint, or a checkpoint into something passed over."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from daemon.watching import candidate_dirs
from inference import layouts
from tests.cases import long_if_zero2

pytestmark = pytest.mark.slow

CASES = (
    "hf",
    "hf_bin",
    "hf_trainer",
    "hf_trainer_deepspeed",
    "deepspeed_zero0",
    "deepspeed_zero1",
    "deepspeed_zero2",
    "deepspeed_zero3",
    "dcp",
    "verl",
    "areal",
    "openrlhf",
    "openrlhf_hf",
)
BESIDE = ("README.md", ".nfs0000000000ab", "events.tmp", "rng_state_0.pth", "trainer_state.json", ".metadata")


def _clutter(folder: Path) -> None:
    for name in BESIDE:
        if not (folder / name).exists():
            (folder / name).write_bytes(b"{}" if name.endswith(".json") else b"")
    run = folder / "wandb" / "run-20261201_120000-ab12cd34" / "files"
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text("a: 1\n")
    (folder / "wandb" / "debug.log").write_text("")


@pytest.mark.parametrize("name", [long_if_zero2(c) for c in CASES])
def test_each_layouts_checkpoint_is_found_beside_what_tools_leave(name: str, tmp_path: Path) -> None:
    case = importlib.import_module(f"tests.cases.{name}").build(tmp_path)
    root = case.source
    candidate = root / case.candidate
    _clutter(root)
    if candidate.parent != root:
        _clutter(candidate.parent)  # inside the save_dir too (OpenRLHF's _actor)
    found = candidate_dirs(root)
    assert candidate in found, [p.relative_to(root).as_posix() for p in found]
    snapshot = layouts.take_snapshot(candidate)
    detected = layouts.detect(candidate, snapshot, "auto")
    # The ZeRO-3 writer saves as OpenRLHF does (_actor/global_stepN): auto names it openrlhf.
    assert detected is not None
    assert detected == ("openrlhf" if candidate.parent.name == "_actor" else case.layout)
    verdict = layouts.inspect(candidate, snapshot, detected, layouts.LayoutSettings(hf_config=case.hf_config))
    assert verdict.readiness is layouts.Readiness.COMPLETE, verdict.reason
