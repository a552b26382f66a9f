"""An older checkpoint that looks incomplete (a shard its index names is missing) holds newer good ones
back for nothing: with invalid_after_secs far away, the good ones are evaluated on time beside it, it is
named in ``evald status`` with what it lacks, and once it is complete it is evaluated too (issue 31)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from storage.database import Database
from tests.checkpoints import copy_checkpoint
from tests.conftest import TOY_SAVE_EVERY, TOY_STEPS, ToyRun
from tests.harness import evald, jobs, running_daemon, upgraded, wait_for, write_config, write_dataset

pytestmark = pytest.mark.slow

QUIET = 0.5
#: The quiet period, the next rescan (rescan_secs = 2), and a margin for a loaded 2-core machine.
START_BOUND = QUIET + 2.0 + 6.0
SHARD = "model-00002-of-00002.safetensors"


def _missing_shard(path: Path) -> None:
    (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": SHARD}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _completed(path: Path) -> None:
    """What the trainer's save would have ended with: the whole model, no dangling index."""
    (path / "model.safetensors.index.json").unlink()
    (path / "model-00001-of-00002.safetensors").rename(path / "model.safetensors")


def _succeeded(database: Database, steps: set[int]) -> dict[int, float] | None:
    """When each of ``steps``' jobs started, once all have succeeded."""
    found = {j.step: j.started_at for j in jobs(database) if j.step in steps and j.state == "succeeded"}
    if set(found) != steps:
        return None
    return {step: at.timestamp() for step, at in found.items() if at is not None}


def test_newer_good_checkpoints_are_evaluated_beside_an_incomplete_older_one(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    dataset = write_dataset(tmp_path / "arith.jsonl", 6)
    config = write_config(tmp_path, database_url, dataset=dataset, quiet=QUIET, invalid_after=600.0)
    root = tmp_path / "run"
    old = copy_checkpoint(toy_run.path / f"step_{TOY_SAVE_EVERY}", root / "step_5", _missing_shard)
    first, last = TOY_SAVE_EVERY, TOY_STEPS
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        written = time.time()
        copy_checkpoint(toy_run.path / f"step_{first}", root / f"step_{first}")
        copy_checkpoint(toy_run.last_checkpoint, root / f"step_{last}")
        started = wait_for(
            lambda: _succeeded(database, {first, last}), 120, "the good ones evaluated", daemon.process
        )
        assert max(started.values()) - written < START_BOUND + 30, started  # two jobs, one at a time
        assert min(started.values()) - written < START_BOUND, started

        status = evald("--config", str(config), "status", "--format", "json")
        assert status.returncode == 0, status.stderr
        [not_ready] = json.loads(status.stdout)["runs"]["toy"]["not_ready"]
        assert (not_ready["checkpoint"], not_ready["step"]) == ("step_5", 5)
        assert SHARD in not_ready["reason"], not_ready
        text = evald("--config", str(config), "status").stdout
        assert f"  not ready:   step_5: {not_ready['reason']}" in text.splitlines(), text

        # Its save completes after all: it is evaluated now, later than the newer ones.
        _completed(old)
        done = wait_for(lambda: _succeeded(database, {5}), 120, "step_5 evaluated", daemon.process)
        assert done[5] > max(started.values())
        assert daemon.stop() == 0

    assert sorted(j.step for j in jobs(database) if j.step is not None) == [5, first, last]
    database.dispose()
