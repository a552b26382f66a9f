"""Discovery against real files and a real database, with a controlled clock instead of sleeps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from daemon.config import RunConfig, SchedulingConfig
from daemon.scheduling.planner import Planner
from daemon.watching.discovery import Discovery, WatchedRun
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.checkpoints import copy_checkpoint, replay, save_tiny_llama
from tests.harness import Clock


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("src") / "model", shard_size="8KB")


def _discovery(db: Database, root: Path, clock: Clock, marker: str | None = None) -> Discovery:
    with db.session() as s:
        run_id = queries.ensure_run(s, "r", str(root))
    run = WatchedRun(RunConfig(name="r", root=root, marker=marker), run_id, ("arith",))
    scheduling = SchedulingConfig(quiet_secs=2.0, invalid_after_secs=30.0)
    return Discovery(db, [run], scheduling, clock=clock, after_ready=Planner(scheduling, db, [run]).plan)


def _states(db: Database) -> dict[str, str]:
    with db.session() as s:
        return {c.name: c.state for c in queries.checkpoint_rows(s)}


def _jobs(db: Database) -> list[tuple[int | None, str]]:
    with db.session() as s:
        return [(j.step, j.state) for j in queries.job_rows(s)]


def test_slow_writer_is_read_only_after_the_quiet_period(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root, clock = tmp_path / "run", Clock()
    root.mkdir()
    discovery = _discovery(database, root, clock)
    for _ in replay(source, root / "step_100", chunks=3):
        # Writes 1.5 s apart: always inside the quiet period, events or not.
        discovery.hint("r", root / "step_100")
        discovery.tick()
        clock.now += 1.5
        assert _jobs(database) == []
    discovery.tick()
    assert _jobs(database) == []  # 1.5 s after the last write
    clock.now += 0.6
    discovery.tick()
    assert _jobs(database) == [(100, "pending")]
    assert _states(database) == {"step_100": "ready"}
    # Events after it is settled change nothing: one job per checkpoint × task.
    discovery.hint("r", root / "step_100")
    discovery.scan()
    assert _jobs(database) == [(100, "pending")]


def test_long_pause_inside_a_shard_is_not_mistaken_for_completion(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root, clock = tmp_path / "run", Clock()
    root.mkdir()
    discovery = _discovery(database, root, clock)
    for step in replay(source, root / "step_7", chunks=2):
        discovery.scan()
        clock.now += 10.0  # far past the quiet period between writes
        discovery.tick()
        if "index.json" not in step:
            assert _jobs(database) == [], step
    discovery.tick()
    assert _jobs(database) == [(7, "pending")]


def test_marker_makes_it_ready_at_once_and_broken_ones_invalid(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root, clock = tmp_path / "run", Clock()
    root.mkdir()
    discovery = _discovery(database, root, clock, marker="COMPLETE")
    good = copy_checkpoint(source, root / "step_1")
    discovery.scan()
    assert _jobs(database) == []  # complete files, but no marker yet
    (good / "COMPLETE").touch()
    discovery.hint("r", good)
    assert _jobs(database) == [(1, "pending")]

    def drop_a_shard(path: Path) -> None:
        next(path.glob("model-00002-*.safetensors")).unlink()
        (path / "COMPLETE").touch()

    copy_checkpoint(source, root / "step_2", drop_a_shard)
    discovery.scan()
    with database.session() as s:
        rows = {c.name: c for c in queries.checkpoint_rows(s)}
    assert rows["step_2"].state == "invalid"
    assert rows["step_2"].reason is not None and "model-00002-" in rows["step_2"].reason


def test_incomplete_for_too_long_becomes_invalid(database: Database, source: Path, tmp_path: Path) -> None:
    root, clock = tmp_path / "run", Clock()
    root.mkdir()
    discovery = _discovery(database, root, clock)

    def truncate(path: Path) -> None:
        shard = next(path.glob("model-00001-*.safetensors"))
        os.truncate(shard, shard.stat().st_size - 10)

    copy_checkpoint(source, root / "step_3", truncate)
    discovery.scan()
    assert _states(database) == {"step_3": "discovered"}
    clock.now += 31
    discovery.tick()
    with database.session() as s:
        row = queries.checkpoint_rows(s)[0]
    assert row.state == "invalid"
    assert row.reason is not None and row.reason.startswith(
        "still incomplete after 31 s unchanged: model-00001-"
    )


def test_ignored_names_vanished_and_outside_symlinks(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root, clock = tmp_path / "run", Clock()
    root.mkdir()
    discovery = _discovery(database, root, clock)
    for name in ("tmp-checkpoint-5", ".hidden", "step_9.tmp"):
        copy_checkpoint(source, root / name)
    elsewhere = copy_checkpoint(source, tmp_path / "elsewhere")
    (root / "step_11").symlink_to(elsewhere, target_is_directory=True)
    half = root / "step_12"
    half.mkdir()
    (half / "config.json").write_bytes((source / "config.json").read_bytes())
    discovery.scan()
    assert _states(database) == {"step_11": "invalid", "step_12": "discovered"}
    (half / "config.json").unlink()
    half.rmdir()
    clock.now += 3
    discovery.tick()
    assert _states(database) == {"step_11": "invalid", "step_12": "vanished"}
    assert _jobs(database) == []


def test_restart_waits_the_quiet_period_again(database: Database, source: Path, tmp_path: Path) -> None:
    root, clock = tmp_path / "run", Clock()
    root.mkdir()
    first = _discovery(database, root, clock)
    copy_checkpoint(source, root / "step_4")
    first.scan()
    assert _states(database) == {"step_4": "discovered"}
    second = _discovery(database, root, clock)  # the daemon restarted
    second.scan()
    assert _jobs(database) == []
    clock.now += 2.5
    second.tick()
    assert _jobs(database) == [(4, "pending")]
    assert _states(database)["step_4"] == CheckpointState.READY


def test_an_emptied_recorded_checkpoint_ends_invalid_and_releases_newer_ones(
    database: Database, source: Path, tmp_path: Path
) -> None:
    """step_1 was recorded while written, then a crashed save left its folder empty: it ends invalid
    after invalid_after_secs, so step_2 (held behind it, plans go in step order) is planned."""
    root, clock = tmp_path / "run", Clock()
    root.mkdir()
    discovery = _discovery(database, root, clock)
    partial = copy_checkpoint(source, root / "step_1", lambda p: next(p.glob("model-00002-*")).unlink())
    discovery.scan()
    assert _states(database) == {"step_1": "discovered"}
    for child in partial.iterdir():
        child.unlink()
    copy_checkpoint(source, root / "step_2")
    discovery.scan()
    clock.now += 3.0
    discovery.tick()
    assert _states(database) == {"step_1": "discovered", "step_2": "ready"}
    assert _jobs(database) == []  # held behind step_1
    clock.now += 30.0
    discovery.tick()
    assert _states(database) == {"step_1": "invalid", "step_2": "ready"}
    assert _jobs(database) == [(2, "pending")]
