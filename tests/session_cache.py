"""Expensive test inputs built once per test session, shared by every pytest-xdist worker.

The toy trainer run and the layout writers (DeepSpeed on 2 ranks, the HF Trainer) take tens of seconds
each. ``make test`` runs the suite on several xdist workers, so a per-process cache would build each of
them once per worker: here the first worker that needs one builds it under a file lock, the others wait
for it and read the same folder. Tests only read what is cached (they copy it before changing it).

The controller process picks the cache folder (``pytest_configure``) and removes it at the end
(``pytest_unconfigure``); workers inherit it through ``EVALD_TEST_CACHE``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

CACHE_ENV = "EVALD_TEST_CACHE"


def open_session() -> Path | None:
    """Pick this session's cache folder, unless a parent process already did. Returns the folder this
    call created (for :func:`close_session`), or ``None`` when it was inherited."""
    if os.environ.get(CACHE_ENV):
        return None
    root = Path(tempfile.mkdtemp(prefix="evald-test-cache-"))
    os.environ[CACHE_ENV] = str(root)
    return root


def close_session(root: Path | None) -> None:
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
        if os.environ.get(CACHE_ENV) == str(root):
            del os.environ[CACHE_ENV]


def cache_root() -> Path:
    """The session's cache folder; outside pytest (a writer module run by hand), one for this process."""
    if not os.environ.get(CACHE_ENV):
        root = Path(tempfile.mkdtemp(prefix="evald-test-cache-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        os.environ[CACHE_ENV] = str(root)
    return Path(os.environ[CACHE_ENV])


class BuildFailed(RuntimeError):
    """Another worker already tried to build this input and failed; its message, not a second try."""


def built_once(key: str, build: Callable[[Path], None], *, beside: tuple[str, ...] = ()) -> Path:
    """``cache_root()/key``, built by ``build(path)`` in whichever process asks first.

    ``beside`` names sibling folders ``build`` also writes (``key_reference``): removed with ``key`` when
    a try left them half-written. A failed build is recorded, so that the other workers fail with its
    message at once instead of spending the same minutes again.
    """
    root = cache_root()
    target = root / key
    done = root / f"{key}.done"
    failed = root / f"{key}.failed"
    with FileLock(str(root / f"{key}.lock")):
        if failed.exists():
            raise BuildFailed(f"building {key} failed in another test process:\n{failed.read_text()}")
        if not done.exists():
            for path in (target, *(root / name for name in beside)):
                shutil.rmtree(path, ignore_errors=True)
            try:
                build(target)
            except Exception as exc:
                failed.write_text(f"{type(exc).__name__}: {exc}")
                raise
            done.touch()
    return target
