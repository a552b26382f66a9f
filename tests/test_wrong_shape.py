"""A checkpoint with one tensor of the wrong shape (issue 31): transformers refuses it with "You set
`ignore_mismatched_sizes`...", naming no tensor. The job's error names the tensor, both shapes
(checkpoint and config) and the file, in the database, in ``evald status`` and in one log line, while
the good checkpoints beside it are evaluated."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import TOY_SAVE_EVERY, ToyRun
from tests.harness import (
    all_jobs_done,
    evald,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)

pytestmark = pytest.mark.slow

TENSOR = "model.layers.1.mlp.up_proj.weight"


def _wrong_shape(source: Path, target: Path) -> Path:
    """``source`` with ``TENSOR`` saved as 200 rows where config.json says 256."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    weights = load_file(target / "model.safetensors")
    assert tuple(weights[TENSOR].shape) == (256, 128)
    weights[TENSOR] = torch.zeros(200, 128)
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def test_a_tensor_of_the_wrong_shape_is_named_with_both_shapes_and_its_file(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "arith.jsonl", 6))
    root = tmp_path / "run"
    shutil.copytree(toy_run.path / f"step_{TOY_SAVE_EVERY}", root / "step_15")
    _wrong_shape(toy_run.last_checkpoint, root / "step_20")
    shutil.copytree(toy_run.last_checkpoint, root / "step_30")

    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        rows = wait_for(lambda: all_jobs_done(database, 3), 180, "three jobs done", daemon.process)
        status = evald("--config", str(config), "status")
        status_json = evald("--config", str(config), "status", "--format", "json")
        assert daemon.stop() == 0

    by_step = {j.step: j for j in rows}
    assert {s: j.state for s, j in by_step.items()} == {15: "succeeded", 20: "failed", 30: "succeeded"}
    bad = by_step[20]
    expected = f"{TENSOR} is [200, 128] in model.safetensors, config.json gives [256, 128]"
    assert bad.error_kind == "checkpoint_invalid" and bad.error is not None
    assert expected in bad.error and str(root / "step_20") in bad.error
    assert "ignore_mismatched_sizes" not in bad.error
    # The text names the tensor on the job's one line (cut to the width); the JSON holds all of it.
    assert status.returncode == 0 and f"{TENSOR} is [200, 128]" in status.stdout
    assert status_json.returncode == 0 and expected in status_json.stdout
    failed = [
        json.loads(line)
        for line in log.read_text().splitlines()
        if line.startswith("{") and '"job.failed"' in line
    ]
    assert len(failed) == 1 and expected in str(failed[0]["error"])
    database.dispose()
