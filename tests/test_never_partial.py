"""No layout's checkpoint is ever read early: 20 slow writes per layout, replayed from the real writer.

Each case (``tests/cases/<layout>.py``) is a finished checkpoint and the order its trainer writes the
files. A writer replays that order into a watched root: files appear one by one, large ones in several
appends, trackers (``latest``) and markers last, with random pauses shorter than the quiet period and
with filesystem events sometimes lost. Discovery (``layout = "auto"``) runs against a real SQLite
database on a controlled clock. No job may exist before the last byte is written; one must exist once
the quiet period has passed after it.
"""

from __future__ import annotations

import importlib
import pkgutil
import random
import shutil
from pathlib import Path

import pytest

import tests.cases
from daemon.config import RunConfig, SchedulingConfig
from daemon.scheduling.planner import Planner
from daemon.watching import Discovery, WatchedRun, top_level_child
from storage import queries
from storage.database import Database
from tests.cases import long_if_zero2
from tests.checkpoints import LayoutCase
from tests.harness import Clock

TRIALS = 20
QUIET = 2.0
CASES = sorted(m.name for m in pkgutil.iter_modules(tests.cases.__path__) if not m.name.startswith("_"))


@pytest.fixture(scope="module", params=[long_if_zero2(c) for c in CASES])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LayoutCase:
    module = importlib.import_module(f"tests.cases.{request.param}")
    built: LayoutCase = module.build(tmp_path_factory.mktemp(request.param))
    return built


def _writes(case: LayoutCase, rng: random.Random) -> list[tuple[Path, bytes, bool]]:
    """(file, bytes to append, is_first_chunk) in the trainer's order; big files in 2–5 appends."""
    writes: list[tuple[Path, bytes, bool]] = []
    for relpath in case.order:
        data = (case.source / relpath).read_bytes()
        pieces = rng.randint(2, 5) if len(data) > 4096 else 1
        size = max(1, -(-len(data) // pieces))
        chunks = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
        writes.extend((Path(relpath), chunk, i == 0) for i, chunk in enumerate(chunks))
    return writes


def test_slow_writer_is_never_read_early(case: LayoutCase, sqlite_template: Path, tmp_path: Path) -> None:
    rng = random.Random(f"{case.layout}:{case.candidate}")
    missing = [p for p in case.order if not (case.source / p).is_file()]
    assert not missing, f"case lists files the writer did not write: {missing}"
    for trial in range(TRIALS):
        root = tmp_path / f"trial{trial}" / "run"
        root.mkdir(parents=True)
        # A fresh database per trial, copied from one already migrated (260 trials of migrations took
        # minutes).
        shutil.copyfile(sqlite_template, root.parent / "evald.db")
        database = Database(f"sqlite:///{root.parent / 'evald.db'}")
        with database.session() as s:
            run_id = queries.ensure_run(s, "r", str(root))
        clock = Clock()
        run = WatchedRun(RunConfig(name="r", root=root, hf_config=case.hf_config), run_id, ("t",))
        scheduling = SchedulingConfig(quiet_secs=QUIET, invalid_after_secs=3600, rescan_secs=5)
        planner = Planner(scheduling, database, [run])
        discovery = Discovery(database, [run], scheduling, clock=clock, after_ready=planner.plan)
        writes = _writes(case, rng)
        for number, (relpath, chunk, first) in enumerate(writes):
            target = root / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb" if first else "ab") as handle:
                handle.write(chunk)
            clock.now += rng.uniform(0.0, QUIET * 0.9)
            hinted = top_level_child(root, target)
            if hinted is not None and rng.random() < 0.7:  # events are hints, and some are lost
                discovery.hint("r", hinted)
            discovery.tick()
            if rng.random() < 0.2:
                discovery.scan()
            if number + 1 == len(writes):
                break  # the last byte is written: from here on reading it is right
            with database.session() as s:
                early = queries.job_rows(s)
            assert early == [], f"trial {trial}: read after write {number + 1}/{len(writes)} ({relpath})"
        # The rescan (or a late event) sees the last write; the quiet period later it is read.
        discovery.scan()
        clock.now += QUIET + 0.1
        discovery.tick()
        with database.session() as s:
            rows = queries.job_rows(s)
            checkpoints = queries.checkpoint_rows(s)
        assert [(j.checkpoint, j.step) for j in rows] == [(case.candidate, case.step)], (trial, checkpoints)
        database.dispose()
