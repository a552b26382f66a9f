# --- inference fixtures ---
# A tiny model trained once per session by the real trainer process, and a held-out dataset for it.
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from inference.toy.problems import held_out_problems, write_jsonl
from tests import forkserver
from tests.deadlines import patient
from tests.file_weights import order
from tests.session_cache import built_once, cache_root, close_session, open_session

# pytest rewrites each test module's asserts, and keeps the result only where bytecode may be written: with
# PYTHONDONTWRITEBYTECODE set (as this machine's shells and CI set it) every test process rewrote all 160
# modules again at every run, 12 CPU-s a process instead of 6. This process's own setting only: the
# daemons, CLI calls and workers the tests start keep the environment's.
sys.dont_write_bytecode = False

#: Environment for processes started by tests: no network, no progress bars.
SUBPROCESS_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
TOY_STEPS = 30
TOY_SAVE_EVERY = 15


_OWN_CACHE: list[Path | None] = []
_FORKS: list[forkserver.Session] = []


def pytest_configure(config: pytest.Config) -> None:
    # A test process holds 0.6-1 M objects (the libraries its tests loaded), and with the default first
    # threshold (700) the temporaries of a test survived into the oldest generation often enough to start
    # a full collection every few seconds: 15 of them in 95 s of ten test files on one process, 4.5 CPU-s.
    # With 10,000 they die young: 3 full collections, and 2.5 CPU-s of collecting in all instead of 5.9.
    gc.set_threshold(10_000, 10, 10)
    # The controller (or a plain run) picks the session cache; xdist workers inherit it.
    own = open_session()
    _OWN_CACHE.append(own)
    if own is not None:
        # One fork server for the session (tests/forkserver.py): the daemons the tests start (and the tests
        # that run a worker themselves) take their workers from it through the shim, which every process
        # started from here inherits as the daemons' `[inference] python`.
        session = forkserver.start_session(cache_root() / "forks")
        if session is not None:
            _FORKS.append(session)
            os.environ[forkserver.PYTHON_OVERRIDE_ENV] = str(session.shim)
            os.environ[forkserver.CLI_PYTHON_ENV] = str(session.cli.shim)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for session in _FORKS:
        terminalreporter.write_line(session.summary())


def pytest_unconfigure(config: pytest.Config) -> None:
    # A test process ends with a heap of 1-1.5 M objects (every library its tests loaded), which the
    # collections of pytest's unraisable-exception check and of Python's exit walked for 7-10 s (py-spy:
    # gc_collect_main) at the end of the suite, with nothing else left to run. Frozen, they are not walked:
    # the process's memory goes back whole at exit.
    gc.freeze()
    while _FORKS:
        os.environ.pop(forkserver.PYTHON_OVERRIDE_ENV, None)
        os.environ.pop(forkserver.CLI_PYTHON_ENV, None)
        _FORKS.pop().close()
    if _OWN_CACHE:
        close_session(_OWN_CACHE.pop())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A daemon-level scenario (marked slow) that runs on both backends is the same scenario twice: the
    # SQLite run stays in `make test`, the PostgreSQL run is `long` (`make test-long`, CI). The storage and
    # query tests, and the scenarios written for PostgreSQL alone (outages, several daemons), stay on both.
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            callspec is not None
            and callspec.params.get("database_url") == "postgres"
            and item.get_closest_marker("slow") is not None
        ):
            item.add_marker(pytest.mark.long)
    # The Ray files, then the longest first (tests/file_weights.py); a stable sort keeps each file's order.
    items.sort(key=lambda item: order(item.path.name))


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
def toy_run() -> ToyRun:
    """``python -m inference.toy.trainer`` run for a few steps: enough to learn the answer format.

    Trained once per session, whatever the number of xdist workers; tests copy its checkpoints before
    changing them."""
    folder = built_once("toy-run", _train_toy)
    stdout = (folder / "stdout.txt").read_text()
    # Only the trainer's own JSON lines: libraries (DeepSpeed's accelerator notice) may print too.
    saved = tuple(json.loads(line) for line in stdout.splitlines() if line.startswith("{"))
    return ToyRun(path=folder / "run", saved=saved, stderr=(folder / "stderr.txt").read_text())


def _train_toy(folder: Path) -> None:
    folder.mkdir(parents=True)
    command = [
        forkserver.worker_python(),
        "-m",
        "inference.toy.trainer",
        "--out",
        str(folder / "run"),
        "--steps",
        str(TOY_STEPS),
        "--save-every",
        str(TOY_SAVE_EVERY),
        "--threads",
        "1",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=SUBPROCESS_ENV, timeout=patient(300))
    assert done.returncode == 0, done.stderr
    (folder / "stdout.txt").write_text(done.stdout)
    (folder / "stderr.txt").write_text(done.stderr)


@pytest.fixture
def toy_dataset(tmp_path: Path) -> Path:
    """20 held-out toy problems as JSONL (``id``, ``problem``, ``answer``)."""
    path = tmp_path / "heldout.jsonl"
    write_jsonl(held_out_problems(20, seed=1), path)
    return path


# --- end of inference fixtures ---


# --- CPU profile of the suite (EVALD_TEST_CPU_PROFILE=FILE) ---
# Wall time follows the machine's load; CPU time much less. Each test's CPU (this process and every child
# process it reaped: daemons with their workers, CLI calls, trainers) goes to FILE as a JSON line, to find
# where the suite's time goes on a shared machine (BENCHMARKS.md, "Test suite time").
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    target = os.environ.get("EVALD_TEST_CPU_PROFILE")
    if not target:
        yield
        return
    import time

    before, started = os.times(), time.monotonic()
    yield
    after = os.times()
    own = sum(getattr(after, f) - getattr(before, f) for f in ("user", "system"))
    cpu = own + sum(getattr(after, f) - getattr(before, f) for f in ("children_user", "children_system"))
    line = {
        "test": item.nodeid,
        "cpu_s": round(cpu, 2),
        # The test process's own part (the rest is the children it reaped).
        "own_s": round(own, 2),
        "wall_s": round(time.monotonic() - started, 2),
        # When it ended (with the process, added below): the schedule's idle tails show in them.
        "end": round(time.time(), 2),
    }
    _profile(target, line)


def _profile(target: str, line: dict[str, object]) -> None:
    """``line``, with the test process that wrote it, appended to the CPU profile ``target``."""
    line = {**line, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with Path(target).open("a") as out:
        out.write(json.dumps(line) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    # A module's or the session's fixtures end in the teardown of its last test: a slow one (a cluster
    # stopped at the session's end) shows here on its own line.
    target = os.environ.get("EVALD_TEST_CPU_PROFILE")
    if not target:
        yield
        return
    import time

    started = time.monotonic()
    yield
    took = time.monotonic() - started
    if took >= 1.0:
        _profile(target, {"teardown": item.nodeid, "wall_s": round(took, 2)})
