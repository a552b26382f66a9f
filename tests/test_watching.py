"""Watching filesystems: inotify, polling, containers, trackers, renames and inotify's failure modes."""

from __future__ import annotations

import errno
import logging
import shutil
import threading
from pathlib import Path

import pytest
import structlog

from daemon.config import RunConfig, SchedulingConfig
from daemon.scheduling.planner import Planner
from daemon.watching import Discovery, WatchedRun, candidate_dirs, filesystem, is_container
from daemon.watching import watcher as watcher_module
from daemon.watching.watcher import Watcher
from storage import queries
from storage.database import Database
from tests import deep_trees
from tests.checkpoints import copy_checkpoint, save_tiny_llama
from tests.conftest import ToyRun
from tests.deadlines import Deadline
from tests.harness import all_jobs_done, jobs, running_daemon, upgraded, wait_for, write_config, write_dataset

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
server:/export /mnt/shared nfs4 rw,vers=4.2 0 0
/dev/vdb /mnt/shared/local ext4 rw 0 0
lustre@tcp:/fs /lus lustre rw 0 0
/dev/vdc /mnt/with\\040space xfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/home/u/run", "ext4"),
        ("/mnt/shared/grpo/run", "nfs4"),
        ("/mnt/shared/local/run", "ext4"),
        ("/mnt/sharedx/run", "ext4"),
        ("/lus/scratch/run", "lustre"),
        ("/mnt/with space/run", "xfs"),
    ],
)
def test_filesystem_type_is_the_longest_mount_prefix(path: str, expected: str) -> None:
    assert filesystem.fstype_of(Path(path), MOUNTS) == expected


def test_network_filesystems_are_polled() -> None:
    assert {"nfs4", "lustre", "gpfs"} <= filesystem.NETWORK_FILESYSTEMS
    assert "ext4" not in filesystem.NETWORK_FILESYSTEMS
    assert filesystem.is_network(Path("/tmp")) is False


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("src") / "model")


def test_containers_hold_candidates(source: Path, tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "_actor").mkdir(parents=True)
    copy_checkpoint(source, root / "_actor" / "global_step5")
    (root / "_actor" / "latest").write_text("global_step5")
    copy_checkpoint(source, root / "final")  # no step in its name, but it holds files: a checkpoint
    (root / "fresh").mkdir()  # nothing in it yet: a checkpoint being started, not a container
    assert is_container(root / "_actor")
    assert not is_container(root / "final") and not is_container(root / "fresh")
    assert candidate_dirs(root) == [root / "_actor" / "global_step5", root / "final", root / "fresh"]


def test_container_checkpoint_is_found_and_named_by_its_path(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root = tmp_path / "run"
    (root / "_actor").mkdir(parents=True)
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(root))
    now = [0.0]
    run = WatchedRun(RunConfig(name="r", root=root, layout="hf"), run_id, ("t",))
    scheduling = SchedulingConfig(quiet_secs=1.0)
    planner = Planner(scheduling, database, [run])
    discovery = Discovery(database, [run], scheduling, clock=lambda: now[0], after_ready=planner.plan)
    copy_checkpoint(source, root / "_actor" / "global_step7")
    discovery.hint("r", root / "_actor")
    now[0] += 1.5
    discovery.tick()
    with database.session() as s:
        rows = queries.checkpoint_rows(s)
    assert [(r.name, r.step, r.state) for r in rows] == [("_actor/global_step7", 7, "ready")]
    assert discovery.enqueued == 1


def test_overflow_warning_asks_for_a_rescan(tmp_path: Path) -> None:
    watcher = Watcher({"r": tmp_path}, threading.Event())
    watcher.start()
    try:
        # The record watchdog emits (observers/inotify.py) when the kernel queue overflowed.
        logging.getLogger("watchdog.observers.inotify").warning(
            "Inotify queue overflowed; reconciling recursive watches below %r", str(tmp_path)
        )
        assert watcher.overflowed.is_set()
    finally:
        watcher.stop()


def test_watch_limit_falls_back_to_the_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The kernel's inotify watch limit is machine-wide and cannot be lowered for one test: fake its error
    # at the one call that meets it.
    watcher = Watcher({"r": tmp_path}, threading.Event())

    def limit_reached(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")

    monkeypatch.setattr(watcher._observer, "schedule", limit_reached)
    with structlog.testing.capture_logs() as captured:
        watcher.start()
    watcher.stop()
    events = [e["event"] for e in captured]
    assert "watcher.unavailable" in events and "watcher.started" not in events
    assert next(e for e in captured if e["event"] == "watcher.unavailable")["fallback"] == "rescan"


@pytest.mark.slow
def test_poll_mode_finds_checkpoints_without_inotify(sqlite_url: str, tmp_path: Path) -> None:
    upgraded(sqlite_url).dispose()
    dataset = write_dataset(tmp_path / "d.jsonl", 3)
    config = write_config(
        tmp_path, sqlite_url, dataset=dataset, run_extra='watch_mode = "poll"\nlayout = "hf"'
    )
    database = Database(sqlite_url)
    source = save_tiny_llama(tmp_path / "src" / "model")
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        copy_checkpoint(source, tmp_path / "run" / "step_3")
        wait_for(lambda: jobs(database) or None, 30, "the polled checkpoint's job", daemon.process)
        assert daemon.stop() == 0
    assert b'"watcher.started"' not in (tmp_path / "daemon.log").read_bytes()
    database.dispose()


@pytest.mark.slow
def test_a_folder_renamed_into_the_root_is_found_by_inotify(
    sqlite_url: str, tmp_path: Path, toy_run: ToyRun
) -> None:
    upgraded(sqlite_url).dispose()
    dataset = write_dataset(tmp_path / "d.jsonl", 3)
    config = write_config(tmp_path, sqlite_url, dataset=dataset)
    text = config.read_text().replace("rescan_secs = 2.0", "rescan_secs = 600.0")
    config.write_text(text)
    staged = copy_checkpoint(toy_run.last_checkpoint, tmp_path / "staging" / "step_30")
    database = Database(sqlite_url)
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        staged.rename(tmp_path / "run" / "step_30")  # one rename, as trainers that stage do
        rows = wait_for(
            lambda: all_jobs_done(database, 1), 60, "the renamed checkpoint evaluated", daemon.process
        )
        assert daemon.stop() == 0
    assert [(j.step, j.state) for j in rows] == [(30, "succeeded")]
    database.dispose()


def _hint(watcher: Watcher, wake: threading.Event, expected: Path) -> None:
    """Drain the watcher (as the main loop does) until it hints at ``expected``; a generous deadline, since
    the event is normally there at once."""
    deadline = Deadline(60)
    while not deadline.expired():
        wake.wait(1)
        wake.clear()
        if any(path == expected for _, path in watcher.drain()):
            return
    raise AssertionError(f"no hint for {expected}")


def test_a_tree_thousands_deep_in_a_checkpoint_never_reaches_the_watch(tmp_path: Path) -> None:
    """A folder nested 3,000 deep in one checkpoint stopped the daemon at start (watchdog's recursive set-up
    walk raised ``RecursionError``) and, made while it ran, killed the watch of every checkpoint."""
    root = tmp_path / "run"
    deep_trees.make(root / "step_1" / "junk", 3000)
    wake = threading.Event()
    watcher = Watcher({"r": root}, wake)
    try:
        with structlog.testing.capture_logs() as captured:
            watcher.start()
        assert [e["event"] for e in captured] == ["watcher.started"]
        (root / "step_2").mkdir()
        _hint(watcher, wake, root / "step_2")  # and the new folder gets its own watch
        deep_trees.make(root / "step_2" / "junk", 3000)
        (root / "step_2" / "config.json").write_text("{}")
        _hint(watcher, wake, root / "step_2")
        (root / "step_3").mkdir()
        _hint(watcher, wake, root / "step_3")
        with structlog.testing.capture_logs() as captured:
            watcher.refresh()
        assert captured == []  # no watch died
        assert all(emitter.is_alive() for emitter in watcher._observer.emitters)
    finally:
        watcher.stop()
        for name in ("step_1", "step_2"):
            deep_trees.remove(root / name / "junk")


def test_folders_directly_in_the_root_are_watched_and_nothing_below(tmp_path: Path) -> None:
    root = tmp_path / "run"
    for name in ("step_1", "step_2", ".hidden", "tmp-checkpoint-3"):
        (root / name / "actor" / "huggingface").mkdir(parents=True)
    wake = threading.Event()
    watcher = Watcher({"r": root}, wake)
    try:
        watcher.start()
        watched = sorted(Path(emitter.watch.path) for emitter in watcher._observer.emitters)
        assert watched == [root, root / "step_1", root / "step_2"]
        assert not any(emitter.watch.is_recursive for emitter in watcher._observer.emitters)
        # A file written in a checkpoint folder is a hint for that folder.
        (root / "step_1" / "trainer_state.json").write_text("{}")
        _hint(watcher, wake, root / "step_1")
        # A folder removed loses its watch at the next refresh; one made is watched from the hint on.
        shutil.rmtree(root / "step_2")
        (root / "step_4").mkdir()
        _hint(watcher, wake, root / "step_4")
        watcher.refresh()
        watched = sorted(Path(emitter.watch.path) for emitter in watcher._observer.emitters)
        assert watched == [root, root / "step_1", root / "step_4"]
    finally:
        watcher.stop()


def test_a_root_with_more_folders_than_the_watch_limit_leaves_the_rest_to_the_rescan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "run"
    for step in range(5):
        (root / f"step_{step}").mkdir(parents=True)
    monkeypatch.setattr(watcher_module, "MAX_CHILD_WATCHES", 3)
    monkeypatch.setattr(watcher_module.watched_children, "__defaults__", (3,))
    watcher = Watcher({"r": root}, threading.Event())
    try:
        with structlog.testing.capture_logs() as captured:
            watcher.start()
            watcher.refresh()
        assert [e["event"] for e in captured] == ["watcher.started", "watcher.limited"]
        assert len(watcher._observer.emitters) == 1 + 3
    finally:
        watcher.stop()
