"""The read boundary's contract against a live daemon (docs/concepts/read-boundary.md), on SQLite and
PostgreSQL: the generator of tests/test_read_boundary.py builds each example's run root, some of it before
the daemon starts and some while it runs. Whatever the tree, the daemon stays up (no unplanned exit, no
failed pass), every good checkpoint is evaluated once, every bad item is named by one warning line and
listed by ``evald status``, and SIGTERM ends the daemon within 5 s.

A live daemon is seconds an example, so few examples are drawn: the scanner-level test draws many.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from daemon.watching import refusals
from storage import queries
from storage.database import Database
from tests import deep_trees
from tests.conftest import ToyRun
from tests.deadlines import Deadline
from tests.fixtures import fresh_postgres
from tests.harness import (
    checkpoints,
    evald,
    jobs,
    running_daemon,
    upgraded,
    write_config,
    write_dataset,
)
from tests.test_read_boundary import TREES, Item, _all_makers, _write

pytestmark = [pytest.mark.long, pytest.mark.slow]

#: SIGTERM to exit (the contract's bound).
STOP_BOUND = 5.0
_examples = itertools.count()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "arith.jsonl", 3)


@contextmanager
def _database(backend: str, folder: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{folder / 'evald.db'}"
        return
    with fresh_postgres() as url:
        yield url


def _warnings(log: Path) -> list[dict[str, object]]:
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip().startswith("{")]
    return [e for e in events if e.get("level") in ("warning", "error")]


def _unsettled(database: Database, good: list[Item], bad: list[Item]) -> list[str]:
    """The items not yet where the contract puts them: good ones not evaluated, bad ones not named."""
    done = {j.checkpoint for j in jobs(database) if j.state == "succeeded"}
    with database.session() as session:
        named = {i.name for i in queries.ignored_rows(session)}
    named |= {c.name for c in checkpoints(database) if c.state == "invalid"}
    return [f"{i.name} not evaluated" for i in good if i.name not in done] + [
        f"{i.name!r} not named" for i in bad if refusals.shown(i.name) not in named
    ]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@settings(
    max_examples=3,
    derandomize=True,  # the same few trees at every run: the scanner-level tests draw new ones
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(picks=TREES)
def test_a_live_daemon_keeps_the_read_boundarys_contract(
    picks: list[tuple[str, bool]], backend: str, toy_run: ToyRun, dataset: Path, tmp_path: Path
) -> None:
    source = toy_run.last_checkpoint  # a model the worker can evaluate (its tokenizer too)
    folder = Path(tempfile.mkdtemp(prefix=f"ex{next(_examples)}-", dir=tmp_path))
    with _database(backend, folder) as url:
        database = upgraded(url)
        config = write_config(folder, url, dataset=dataset, quiet=0.5, invalid_after=3.0)
        root = folder / "run"
        makers = _all_makers(source)
        items = _write(makers, source, root, picks, later=False)
        log = folder / "daemon.log"
        try:
            with running_daemon(config, log) as daemon:
                items += _write(makers, source, root, picks, later=True)
                good = [i for i in items if i.good]
                bad = [i for i in items if not i.good]
                left = _unsettled(database, good, bad)
                deadline = Deadline(300)
                while left and not deadline.expired() and daemon.process.poll() is None:
                    time.sleep(0.2)
                    left = _unsettled(database, good, bad)
                assert daemon.process.poll() is None, "the daemon exited"
                assert not left, left
                time.sleep(2.5)  # a rescan (2 s) more: still one line each
                status = evald("--config", str(config), "status", timeout=60)
                stopping = time.monotonic()
                assert daemon.stop() == 0
                stopped_in = time.monotonic() - stopping
            assert stopped_in < STOP_BOUND, stopped_in
            rows = jobs(database)
            assert sorted(j.checkpoint for j in rows) == sorted(i.name for i in good)
            assert all(j.state == "succeeded" for j in rows)
            warnings = _warnings(log)
            assert not [e for e in warnings if str(e.get("event", "")).endswith("pass_failed")]
            assert status.returncode == 0, status.stderr
            for item in bad:
                if item.name.startswith((".", "tmp-")):
                    continue
                path = str(root / item.name)
                said = [e for e in warnings if e.get("path") in (path, refusals.shown(path))]
                assert len(said) == 1, (item, said)
                assert refusals.shown(item.name)[:40] in status.stdout, (item, status.stdout)
        finally:
            database.dispose()
            for nest in root.glob("*/nest"):
                deep_trees.remove(nest)
