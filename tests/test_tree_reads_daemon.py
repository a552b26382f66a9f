"""A real daemon over a run root holding a FIFO named ``model.safetensors`` and a ``config.json`` of JSON
nested 100,000 deep, beside good toy checkpoints, on SQLite and PostgreSQL (issue 31).

The FIFO used to hang the main loop in ``open()`` (no ``daemon.ready``, SIGTERM ignored) and the deep JSON
ended every scheduler pass with a ``RecursionError``; a folder nested 3,000 deep stopped the daemon at
start (watchdog's recursive watch) and, made while it ran, killed every watch (issue 41), as one of more
files than any layout writes held the daemon's memory. Now each is ``invalid`` with a reason naming the file,
one line names it, ``evald status`` lists it, the good checkpoints are evaluated on time, and SIGTERM ends
the daemon promptly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from inference.layouts.base import MAX_TREE_DEPTH, MAX_TREE_ENTRIES
from inference.layouts.files import TOO_DEEP
from storage.database import Database
from storage.queries import CheckpointRow
from tests import deep_trees
from tests.checkpoints import copy_checkpoint
from tests.conftest import TOY_SAVE_EVERY, ToyRun
from tests.harness import (
    checkpoints,
    evald,
    jobs,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)

pytestmark = pytest.mark.slow

QUIET = 0.5
#: As in test_poison_checkpoints: the quiet period, the next rescan (2 s) and a margin for a loaded machine.
START_BOUND = QUIET + 2.0 + 6.0
#: SIGTERM to exit: a daemon blocked in open() on a FIFO took 20 s and more (a watchdog kill).
STOP_BOUND = 5.0
FIFO_REASON = "model.safetensors is a FIFO, not a regular file"
DEEP_REASON = f"config.json {TOO_DEEP}"
TREE_REASON = f"nests folders more than {MAX_TREE_DEPTH} deep"
CROWDED_REASON = f"holds more than {MAX_TREE_ENTRIES:,} files and folders"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "arith.jsonl", 6)


def _fifo_weights(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")


def _deep_config(folder: Path) -> None:
    (folder / "config.json").write_text("[" * 100_000)


def _reference() -> ModuleType:
    """The docs' reference generator (docs/hooks/reference.py, a file mkdocs loads, not a package)."""
    path = Path(__file__).resolve().parent.parent / "docs" / "hooks" / "reference.py"
    spec = importlib.util.spec_from_file_location("evald_docs_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _deep_tree(folder: Path) -> None:
    deep_trees.make(folder / "nest", 3000)


def _crowded(folder: Path) -> None:
    deep_trees.crowd(folder / "spill", MAX_TREE_ENTRIES)


def _bad(root: Path, trained: Path, base: int) -> dict[str, str]:
    """A FIFO-weights folder, a deep-config folder, a folder nested 3,000 deep (it stopped the daemon at
    start and, made while it ran, killed every watch) and one of more files than any layout writes; name →
    their reason."""
    fifo, deep, tree, crowded = (f"step_{base + offset}" for offset in range(4))
    copy_checkpoint(trained, root / fifo, _fifo_weights)
    copy_checkpoint(trained, root / deep, _deep_config)
    copy_checkpoint(trained, root / tree, _deep_tree)
    copy_checkpoint(trained, root / crowded, _crowded)
    return {fifo: FIFO_REASON, deep: DEEP_REASON, tree: TREE_REASON, crowded: CROWDED_REASON}


def _recorded(database: Database, expected: dict[str, str]) -> dict[str, CheckpointRow] | None:
    rows = {c.name: c for c in checkpoints(database)}
    settled = all(name in rows and rows[name].state == "invalid" for name in expected)
    return rows if settled else None


def _evaluated(database: Database, steps: set[int]) -> bool:
    found = {j.step: j.state for j in jobs(database) if j.step in steps}
    return set(found) == steps and set(found.values()) == {"succeeded"}


def _warnings_naming(log: Path, name: str) -> list[dict[str, object]]:
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("level") in ("warning", "error") and f"/{name}" in json.dumps(e)]


def test_fifo_deep_json_deep_trees_and_crowds_are_refused_by_name_beside_good_checkpoints(
    database_url: str, dataset: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=dataset, quiet=QUIET)
    root = tmp_path / "run"
    try:
        _refused_beside_good(database, config, root, toy_run, tmp_path)
    finally:
        for nest in root.glob("*/nest"):
            deep_trees.remove(nest)
        database.dispose()


def _refused_beside_good(
    database: Database, config: Path, root: Path, toy_run: ToyRun, tmp_path: Path
) -> None:
    first, second = TOY_SAVE_EVERY, 2 * TOY_SAVE_EVERY
    copy_checkpoint(toy_run.path / f"step_{first}", root / f"step_{first}")
    expected = _bad(root, toy_run.last_checkpoint, 7000)  # there before the start-up scan

    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:  # daemon.ready: the start-up scan did not block
        wait_for(lambda: _evaluated(database, {first}), 120, f"step_{first} evaluated", daemon.process)
        # Written while it runs, the good one last: it must not wait behind them.
        expected.update(_bad(root, toy_run.last_checkpoint, 7100))
        written = time.time()
        copy_checkpoint(toy_run.last_checkpoint, root / f"step_{second}")
        wait_for(
            lambda: _evaluated(database, {first, second}), 120, f"step_{second} evaluated", daemon.process
        )
        rows = wait_for(lambda: _recorded(database, expected), 30, "the bad folders invalid", daemon.process)
        time.sleep(4.5)  # two more rescans: still one line each
        status = evald("--config", str(config), "status", timeout=60)
        stopping = time.monotonic()
        assert daemon.stop() == 0
        stopped_in = time.monotonic() - stopping

    assert stopped_in < STOP_BOUND, stopped_in
    job = next(j for j in jobs(database) if j.step == second)
    assert job.started_at is not None and job.started_at.timestamp() - written < START_BOUND
    assert {j.step for j in jobs(database)} == {first, second}
    for name, reason in expected.items():
        assert reason in (rows[name].reason or ""), (name, rows[name].reason)
        assert len(_warnings_naming(log, name)) == 1, (name, _warnings_naming(log, name))
    assert status.returncode == 0, status.stderr
    for name in expected:
        assert name in status.stdout, status.stdout
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert not [e for e in lines if str(e.get("event", "")).endswith("pass_failed")]
    assert not [e for e in lines if str(e.get("event", "")).startswith("watcher.") and e["level"] != "info"]
    # Every event the daemon logged is in the log-event reference the docs are built from (it missed the
    # events built with f-strings, checkpoint.ready among them).
    logged = {str(e["event"]) for e in lines if "logger" not in e}
    documented = set(_reference().log_events())
    assert {"checkpoint.ready", "checkpoint.invalid", "job.succeeded"} <= logged
    assert logged <= documented, sorted(logged - documented)
