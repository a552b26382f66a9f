# --- inference fixtures ---
# A tiny model trained once per session by the real trainer process, and a held-out dataset for it.
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from inference.toy.problems import held_out_problems, write_jsonl

#: Environment for processes started by tests: no network, no progress bars.
SUBPROCESS_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
TOY_STEPS = 30
TOY_SAVE_EVERY = 15


@dataclass(frozen=True)
class ToyRun:
    path: Path
    #: The JSON lines the trainer printed on stdout, one per save.
    saved: tuple[dict[str, object], ...]
    stderr: str

    @property
    def last_checkpoint(self) -> Path:
        return self.path / f"step_{TOY_STEPS}"


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> ToyRun:
    """``python -m inference.toy.trainer`` run for a few steps: enough to learn the answer format."""
    run_dir = tmp_path_factory.mktemp("toy") / "run"
    command = [
        sys.executable,
        "-m",
        "inference.toy.trainer",
        "--out",
        str(run_dir),
        "--steps",
        str(TOY_STEPS),
        "--save-every",
        str(TOY_SAVE_EVERY),
        "--threads",
        "1",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    # Only the trainer's own JSON lines: libraries (DeepSpeed's accelerator notice) may print too.
    saved = tuple(json.loads(line) for line in done.stdout.splitlines() if line.startswith("{"))
    return ToyRun(path=run_dir, saved=saved, stderr=done.stderr)


@pytest.fixture
def toy_dataset(tmp_path: Path) -> Path:
    """20 held-out toy problems as JSONL (``id``, ``problem``, ``answer``)."""
    path = tmp_path / "heldout.jsonl"
    write_jsonl(held_out_problems(20, seed=1), path)
    return path


# --- end of inference fixtures ---
