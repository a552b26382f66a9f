"""The read boundary as a contract, tested by a generator (docs/concepts/read-boundary.md).

Hypothesis builds run roots from the ingredients trees are made of (good checkpoints, a DeepSpeed save_dir
with its tags, FIFOs, sockets, dangling and looping symlinks, links out of the root, folders nested deep
or holding too many files, names too long, not UTF-8 or with a newline, files named like checkpoints,
JSON with NaN, keys twice or nested deep, truncated or empty weights, a directory where weights must be,
hidden and being-written folders), some there before the first pass and some written after it, and
drives the real scanner (``Discovery``) on a real SQLite database with a controlled clock, with the real
inotify watcher feeding it hints (``inotify``) or without (``poll``). Whatever the tree:

- no pass raises, and the watcher's watches all stay alive;
- every good checkpoint is ready within its quiet period plus one pass, exactly once (one row, one job);
- every bad item is named, once (one warning or error line; a row with the reason), and never gets a job.

The daemon-level promises (alive, SIGTERM within 5 s, memory bounded) are the live-daemon tests' in
tests/test_tree_reads_daemon.py and the reliability scenario ``read_boundary``.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from daemon.config import RunConfig, SchedulingConfig
from daemon.scheduling.planner import Planner
from daemon.watching import Discovery, WatchedRun, refusals
from daemon.watching.watcher import Watcher
from inference.layouts import base as layout_base
from storage import migrations, queries
from storage.database import Database
from tests import deep_trees
from tests.checkpoints import copy_checkpoint, save_tiny_llama
from tests.harness import Clock

QUIET = 2.0
INVALID_AFTER = 30.0
#: The listing's entry bound, lowered so that a folder past it is cheap to make here (the full bound is
#: tests/test_tree_reads.py's); a good checkpoint holds a handful of files.
ENTRIES = 200


@dataclass(frozen=True)
class Item:
    """One thing put under the run root: its name there, and whether it must become a ready checkpoint."""

    name: str
    good: bool


Maker = Callable[[Path, Path, str], list[Item]]


def _good(source: Path, root: Path, name: str) -> list[Item]:
    copy_checkpoint(source, root / name)
    return [Item(name, True)]


def _save_dir(source: Path, root: Path, name: str) -> list[Item]:
    """A DeepSpeed-style save_dir: the model's config.json and ``latest`` beside step folders."""
    index = int(name.removeprefix("step_"))
    save_dir = f"ds{index}"  # digits, no step word: a container's name
    tags = [f"step_{1000 + 10 * index + k}" for k in (1, 2)]  # steps no other item has
    for tag in tags:
        copy_checkpoint(source, root / save_dir / tag)
    shutil.copy(source / "config.json", root / save_dir / "config.json")
    (root / save_dir / "latest").write_text(tags[-1])
    return [Item(f"{save_dir}/{tag}", True) for tag in tags]


def _replaced(file: str, make: Callable[[Path], object]) -> Maker:
    def maker(source: Path, root: Path, name: str) -> list[Item]:
        folder = copy_checkpoint(source, root / name)
        (folder / file).unlink(missing_ok=True)
        make(folder / file)
        return [Item(name, False)]

    return maker


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    # A unix socket's path must fit 108 bytes: bound in a short folder, then moved into place.
    short = Path(tempfile.mkdtemp(prefix="evald-", dir="/tmp"))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(short / "s"))
    server.close()
    (short / "s").rename(path)
    short.rmdir()


def _truncated(path: Path, source: Path) -> None:
    path.write_bytes((source / "model.safetensors").read_bytes()[:-100])


def _bad_config(text: str) -> Maker:
    return _replaced("config.json", lambda p: p.write_text(text))


def _deep(source: Path, root: Path, name: str) -> list[Item]:
    folder = copy_checkpoint(source, root / name)
    deep_trees.make(folder / "nest", layout_base.MAX_TREE_DEPTH + 3)
    return [Item(name, False)]


def _crowded(source: Path, root: Path, name: str) -> list[Item]:
    folder = copy_checkpoint(source, root / name)
    # As many entries as the bound in force where the folder is read (with the checkpoint's own files, one
    # past it): the scanner tests lower it to ENTRIES; a live daemon has the product's (20,000), and a crowd
    # of 200 was a good checkpoint to it, evaluated, while the test waited for its refusal.
    deep_trees.crowd(folder / "spill", layout_base.MAX_TREE_ENTRIES)
    return [Item(name, False)]


def _renamed(new_name: Callable[[str], str]) -> Maker:
    def maker(source: Path, root: Path, name: str) -> list[Item]:
        target = new_name(name)
        copy_checkpoint(source, root / target)
        return [Item(target, False)]

    return maker


def _stray_file(source: Path, root: Path, name: str) -> list[Item]:
    (root / name).write_bytes(b"PK\x03\x04")
    return [Item(name, False)]


def _loop(source: Path, root: Path, name: str) -> list[Item]:
    other = f"{name}b"  # no other item is named so (theirs end in digits)
    (root / name).symlink_to(root / other)
    (root / other).symlink_to(root / name)
    return [Item(name, False), Item(other, False)]


def _outside(source: Path, root: Path, name: str) -> list[Item]:
    (root / name).symlink_to(source)
    return [Item(name, False)]


def _empty(source: Path, root: Path, name: str) -> list[Item]:
    (root / name).mkdir()
    return [Item(name, False)]


def _weights(source: Path) -> dict[str, Maker]:
    return {
        "truncated": _replaced("model.safetensors", lambda p: _truncated(p, source)),
        "empty_weights": _replaced("model.safetensors", lambda p: p.write_bytes(b"")),
        "weights_dir": _replaced("model.safetensors", lambda p: p.mkdir()),
        "dangling": _replaced("model.safetensors", lambda p: p.symlink_to(p.parent / "gone")),
    }


BAD: dict[str, Maker] = {
    "fifo": _replaced("model.safetensors", _fifo),
    "socket": _replaced("model.safetensors", _socket),
    "nan_config": _bad_config('{"model_type": "llama", "hidden_size": NaN}'),
    "twice_config": _bad_config('{"model_type": "llama", "model_type": "gpt2"}'),
    "deep_config": _bad_config("[" * 100_000),
    "deep_tree": _deep,
    "crowded": _crowded,
    "long_name": _renamed(lambda n: n + "x" * 200),
    "newline_name": _renamed(lambda n: n[:3] + "\n" + n[3:]),
    "not_utf8_name": _renamed(lambda n: n + os.fsdecode(b"\xff")),
    "stray_file": _stray_file,
    "loop": _loop,
    "outside": _outside,
    "empty": _empty,
}
PASSED_OVER: dict[str, Maker] = {
    "hidden": _renamed(lambda n: "." + n),
    "being_written": _renamed(lambda n: "tmp-" + n),
}
GOOD: dict[str, Maker] = {"good": _good, "save_dir": _save_dir}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("src") / "model")


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One SQLite database for every example: each takes a run (and a root) of its own."""
    db = Database(f"sqlite:///{tmp_path_factory.mktemp('db') / 'evald.db'}")
    migrations.upgrade(db)
    yield db
    db.dispose()


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("roots")
    yield folder
    for nest in folder.glob("*/*/nest"):  # deeper than shutil.rmtree's recursion on 3.11
        deep_trees.remove(nest)


_examples = itertools.count()


def _all_makers(source: Path) -> dict[str, Maker]:
    return {**GOOD, **BAD, **_weights(source), **PASSED_OVER}


#: What each example puts under its root: (ingredient, written after the first pass).
INGREDIENTS = sorted([*GOOD, *BAD, "truncated", "empty_weights", "weights_dir", "dangling", *PASSED_OVER])
TREES = st.lists(st.tuples(st.sampled_from(INGREDIENTS), st.booleans()), min_size=1, max_size=8)


def _lines(captured: list[MutableMapping[str, Any]]) -> list[str]:
    return [str(e.get("path", "")) for e in captured if e["log_level"] in ("warning", "error")]


class _Scene:
    """One example: its run, root, discovery, clock and (inotify) watcher."""

    def __init__(self, database: Database, root: Path, mode: str) -> None:
        self.root, self.clock, self.database = root, Clock(), database
        self.run = f"r{root.name}"
        scheduling = SchedulingConfig(quiet_secs=QUIET, invalid_after_secs=INVALID_AFTER)
        with database.session() as s:
            run_id = queries.ensure_run(s, self.run, str(root))
        runs = [WatchedRun(RunConfig(name=self.run, root=root), run_id, ("arith",))]
        planner = Planner(scheduling, database, runs)
        self.discovery = Discovery(database, runs, scheduling, clock=self.clock, after_ready=planner.plan)
        self.wake = threading.Event()
        self.watcher = Watcher({self.run: root}, self.wake) if mode == "inotify" else None

    def one_pass(self) -> None:
        """A pass as the daemon's loop makes it: hints first (inotify), the rescan, the quiet re-looks."""
        if self.watcher is not None:
            self.watcher.refresh()
            for run, path in self.watcher.drain():
                self.discovery.hint(run, path)
        self.discovery.scan()
        self.discovery.tick()

    def checkpoints(self) -> dict[str, queries.CheckpointRow]:
        with self.database.session() as s:
            return {c.name: c for c in queries.checkpoint_rows(s, self.run)}

    def ignored(self) -> dict[str, str]:
        with self.database.session() as s:
            return {i.name: i.reason for i in queries.ignored_rows(s) if i.run == self.run}

    def jobs(self) -> list[str]:
        with self.database.session() as s:
            return [j.checkpoint for j in queries.job_rows(s) if j.run == self.run]


def _assert_named_once(scene: _Scene, item: Item, jobs: list[str], lines: list[str]) -> None:
    """A bad item: no job, a row with its reason (invalid, or ignored), one warning line naming it (none for
    a hidden or being-written folder, passed over at info level)."""
    shown = refusals.shown(item.name)
    assert item.name not in jobs and shown not in jobs, (item, jobs)
    rows, ignored = scene.checkpoints(), scene.ignored()
    named = rows.get(item.name) or rows.get(shown)
    reason = named.reason if named is not None and named.state == "invalid" else ignored.get(shown)
    assert reason, (item, rows, ignored)
    if not item.name.startswith((".", "tmp-")):
        path = scene.root / item.name
        said = [p for p in lines if p in (str(path), refusals.shown(str(path)))]
        assert len(said) == 1, (item, said, reason)


def _write(
    makers: dict[str, Maker], source: Path, root: Path, picks: list[tuple[str, bool]], *, later: bool
) -> list[Item]:
    items: list[Item] = []
    for index, (kind, after) in enumerate(picks):
        if after == later:
            items += makers[kind](source, root, f"step_{index + 1}")
    return items


@pytest.mark.parametrize("mode", ["inotify", "poll"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=TREES)
def test_no_tree_stops_stalls_or_fools_the_scanner(
    picks: list[tuple[str, bool]],
    mode: str,
    source: Path,
    database: Database,
    roots: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(layout_base, "MAX_TREE_ENTRIES", ENTRIES)
    root = roots / f"{mode}{next(_examples)}"
    root.mkdir()
    makers = _all_makers(source)
    items = _write(makers, source, root, picks, later=False)
    scene = _Scene(database, root, mode)
    with structlog.testing.capture_logs() as captured:
        if scene.watcher is not None:
            scene.watcher.start()
        try:
            scene.one_pass()
            items += _write(makers, source, root, picks, later=True)
            scene.one_pass()
            # Within the quiet period plus one pass of their last write, on the daemon's own clock.
            scene.clock.now += QUIET
            scene.one_pass()
            ready_in_time = {n for n, c in scene.checkpoints().items() if c.state == "ready"}
            # Past invalid_after_secs: what could still have been a slow write is given up on too.
            for _ in range(3):
                scene.clock.now += INVALID_AFTER
                scene.one_pass()
            if scene.watcher is not None:
                assert all(e.is_alive() for e in scene.watcher._observer.emitters)
        finally:
            if scene.watcher is not None:
                scene.watcher.stop()
    jobs, lines = scene.jobs(), _lines(captured)
    for item in items:
        if item.good:
            assert item.name in ready_in_time, (item, scene.checkpoints().get(item.name))
            assert jobs.count(item.name) == 1, (item, jobs)
        else:
            _assert_named_once(scene, item, jobs, lines)
    assert len(jobs) == len(set(jobs))


# --- changes over time: a stateful generator -----------------------------------------------------------


class TreeOverTime(RuleBasedStateMachine):
    """Checkpoints written in parts over several passes, rotated away, bad items arriving between passes,
    the clock moving: at every step no checkpoint still being written has a job (never read early) and no
    checkpoint has two; at the end every good one that stayed is evaluated once and every bad item is
    named once."""

    source: Path
    database: Database
    roots: Path

    def __init__(self) -> None:
        super().__init__()
        root = self.roots / f"stateful{next(_examples)}"
        root.mkdir()
        self.scene = _Scene(self.database, root, "inotify")
        assert self.scene.watcher is not None
        self.scene.watcher.start()
        self.makers = _all_makers(self.source)
        self.count = 0
        #: Good checkpoints being written (name → fake time their writing began), written, rotated away.
        self.writing: dict[str, float] = {}
        self.written: set[str] = set()
        self.rotated: set[str] = set()
        self.bad: list[Item] = []
        self.captured = structlog.testing.capture_logs()
        self.lines = self.captured.__enter__()

    def _name(self) -> str:
        self.count += 1
        return f"step_{self.count}"

    @rule()
    def begin_writing(self) -> None:
        name = self._name()
        copy_checkpoint(self.source, self.scene.root / name)
        (self.scene.root / name / "model.safetensors").unlink()  # the weights come last
        self.writing[name] = self.scene.clock.now

    @precondition(lambda self: bool(self.writing))
    @rule(data=st.data())
    def finish_writing(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.writing)))
        del self.writing[name]
        shutil.copy(self.source / "model.safetensors", self.scene.root / name / "model.safetensors")
        self.written.add(name)

    @rule(kind=st.sampled_from(sorted({*BAD, "truncated", "empty_weights", "weights_dir", "dangling"})))
    def add_bad(self, kind: str) -> None:
        self.bad += self.makers[kind](self.source, self.scene.root, self._name())

    @precondition(lambda self: bool(self.written - self.rotated))
    @rule(data=st.data())
    def rotate(self, data: st.DataObject) -> None:
        """The trainer keeps its last few: one written checkpoint goes, evaluated or not."""
        name = data.draw(st.sampled_from(sorted(self.written - self.rotated)))
        shutil.rmtree(self.scene.root / name)
        self.rotated.add(name)

    @rule()
    def one_pass(self) -> None:
        self.scene.one_pass()

    # A write that stalls past invalid_after_secs is given up on, rightly: the clock moves on only while
    # every write under way is younger than half of it.
    @precondition(
        lambda self: all(self.scene.clock.now - t < INVALID_AFTER / 2 for t in self.writing.values())
    )
    @rule(secs=st.sampled_from([0.5, QUIET, QUIET * 2]))
    def advance(self, secs: float) -> None:
        self.scene.clock.now += secs

    @invariant()
    def never_read_early_nor_twice(self) -> None:
        jobs = self.scene.jobs()
        assert len(jobs) == len(set(jobs)), jobs
        assert not set(jobs) & set(self.writing), (jobs, self.writing)

    def teardown(self) -> None:
        try:
            for name in list(self.writing):
                shutil.copy(self.source / "model.safetensors", self.scene.root / name / "model.safetensors")
                self.written.add(name)
            self.writing.clear()
            for secs in (QUIET, INVALID_AFTER, INVALID_AFTER, INVALID_AFTER):
                self.scene.clock.now += secs
                self.scene.one_pass()
            jobs = self.scene.jobs()
            for name in self.written - self.rotated:
                assert jobs.count(name) == 1, (name, jobs)
            for item in self.bad:
                _assert_named_once(self.scene, item, jobs, _lines(self.lines))
        finally:
            self.captured.__exit__(None, None, None)
            assert self.scene.watcher is not None
            self.scene.watcher.stop()


def test_no_change_over_time_fools_the_scanner(
    source: Path, database: Database, roots: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(layout_base, "MAX_TREE_ENTRIES", ENTRIES)
    TreeOverTime.source, TreeOverTime.database, TreeOverTime.roots = source, database, roots
    run_state_machine_as_test(
        TreeOverTime,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
