"""DeepSpeed's CPU shared-memory op loads whatever lock a killed process left: a lock no process builds
under is removed, a build in progress is waited for, a young lock is left to its holder.

Real files in a folder torch resolves as it does on a node (TORCH_EXTENSIONS_DIR), real processes working
in it, and the real op loaded by ``python -m inference.shm_op`` (``make``'s set-up step).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference.shm_op import (
    HOLDER_GRACE_SECS,
    OP_NAME,
    STALE_LOCK_SECS,
    build_folder,
    clear_torch_lock,
    lock_is_stale,
    processes_in,
)
from tests.deadlines import wait_process
from tests.forkserver import worker_python
from tests.harness import wait_for


@pytest.fixture
def extensions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # torch resolves the build folder from this variable first, as it does on a user's node.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    return tmp_path / "extensions"


def _age(path: Path, age_s: float) -> Path:
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def _lock(folder: Path, age_s: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "lock"
    lock.write_text("")
    return _age(lock, age_s)


@pytest.fixture
def worker_in(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A live process working in the build folder, as ninja and the compiler do during a build."""
    folder = tmp_path / "extensions" / OP_NAME
    folder.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(["sleep", "infinity"], cwd=folder)
    yield process
    process.kill()
    process.wait()


def test_a_lock_is_stale_when_old_and_nothing_builds_under_it(tmp_path: Path) -> None:
    now = time.time()
    young = _lock(tmp_path / "young", HOLDER_GRACE_SECS / 3)
    old = _lock(tmp_path / "old", HOLDER_GRACE_SECS + 5)
    ancient = _lock(tmp_path / "ancient", STALE_LOCK_SECS + 5)
    # A holder between taking the lock and starting ninja: not judged yet.
    assert not lock_is_stale(young, now=now, builders=[])
    assert lock_is_stale(old, now=now, builders=[])
    # A build in progress keeps its lock, until no build could take that long.
    assert not lock_is_stale(old, now=now, builders=[4242])
    assert lock_is_stale(ancient, now=now, builders=[4242])
    assert not lock_is_stale(tmp_path / "none" / "lock", now=now, builders=[])


def test_a_process_working_in_the_folder_is_a_builder(
    tmp_path: Path, worker_in: subprocess.Popen[bytes]
) -> None:
    folder = tmp_path / "extensions" / OP_NAME
    assert worker_in.pid in processes_in(folder)
    # A sibling folder's worker is not this folder's.
    assert worker_in.pid not in processes_in(tmp_path / "extensions" / "other_op")


def test_a_lock_left_by_a_killed_load_is_removed_and_the_build_stays(extensions: Path) -> None:
    folder = build_folder()
    assert folder == extensions / OP_NAME
    built = folder / "deepspeed_shm_comm.so"
    built.write_bytes(b"stands in for the build's output")
    lock = _lock(folder, HOLDER_GRACE_SECS + 5)
    clear_torch_lock(folder)
    assert not lock.exists()
    assert built.exists()


def _copy_built_op(extensions: Path) -> Path:
    """This node's built op, copied with its times into ``extensions`` so ninja finds it up to date."""
    original = os.environ.pop("TORCH_EXTENSIONS_DIR")
    try:
        source = build_folder()
    finally:
        os.environ["TORCH_EXTENSIONS_DIR"] = original
    target = extensions / OP_NAME
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("lock", "evald.lock"), dirs_exist_ok=True)
    return target


def _loader(log: Path) -> subprocess.Popen[bytes]:
    # Forked by the session's worker server where there is one (torch and DeepSpeed imported, the op not
    # loaded: the server never starts a group), which reads TORCH_EXTENSIONS_DIR when the op loads.
    with log.open("wb") as out:
        return subprocess.Popen(
            [worker_python(), "-m", "inference.shm_op"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "DS_ACCELERATOR": "cpu"},
        )


def test_the_op_loads_past_a_lock_a_killed_load_left(extensions: Path, tmp_path: Path) -> None:
    """What hung ``make``'s set-up for good: torch waits on a lock file whose holder is gone."""
    folder = _copy_built_op(extensions)
    lock = _lock(folder, HOLDER_GRACE_SECS + 5)
    log = tmp_path / "loader.log"
    loader = _loader(log)
    assert wait_process(loader, 60) == 0, log.read_text()
    output = log.read_text()
    assert "shm_op.stale_lock_removed" in output
    assert f"op is built in {folder}" in output
    assert not lock.exists()


def test_a_build_in_progress_is_waited_for_then_its_lock_goes_with_it(
    extensions: Path, tmp_path: Path, worker_in: subprocess.Popen[bytes]
) -> None:
    folder = _copy_built_op(extensions)
    lock = _lock(folder, HOLDER_GRACE_SECS + 5)
    log = tmp_path / "loader.log"
    loader = _loader(log)
    wait_for(
        lambda: "shm_op.build_in_progress" in log.read_text(), 60, "the loader to wait on the build", loader
    )
    assert lock.exists()
    # The build's process dies without releasing its lock (killed): the loader goes on.
    worker_in.kill()
    worker_in.wait()
    assert wait_process(loader, 60) == 0, log.read_text()
    assert "shm_op.stale_lock_removed" in log.read_text()
    assert not lock.exists()
