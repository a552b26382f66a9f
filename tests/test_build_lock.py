"""A killed DeepSpeed op build's lock is removed before a CPU group starts; a young one stays.

Real files in a folder torch resolves as it does on a node (TORCH_EXTENSIONS_DIR).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from inference.group import STALE_BUILD_LOCK_SECS, clear_stale_build_lock


@pytest.fixture
def extensions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # torch resolves the build folder from this variable first, as it does on a user's node.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    return tmp_path


def _lock(extensions: Path, age_s: float) -> Path:
    folder = extensions / "deepspeed_shm_comm"
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.write_text("")
    stamp = time.time() - age_s
    os.utime(lock, (stamp, stamp))
    return lock


def test_a_lock_older_than_any_build_is_removed(extensions: Path) -> None:
    lock = _lock(extensions, STALE_BUILD_LOCK_SECS + 60)
    assert clear_stale_build_lock() == lock
    assert not lock.exists()
    # The build's own files beside it are left alone.
    assert lock.parent.is_dir()


def test_a_young_lock_is_a_build_in_progress_and_stays(extensions: Path) -> None:
    lock = _lock(extensions, 30)
    assert clear_stale_build_lock() is None
    assert lock.exists()


def test_no_lock_no_change(extensions: Path) -> None:
    assert clear_stale_build_lock() is None
    assert not (extensions / "deepspeed_shm_comm" / "lock").exists()
