"""DeepSpeed's CPU shared-memory all-reduce op, loaded so that a killed process cannot hang the next one.

torch builds (or checks with ninja) a JIT extension under a bare lock file that it waits on forever, and
every fresh process takes that lock for the up-to-date check, not only the first build. A process killed
while holding it (a worker stopped in its first second, a session or CI job ended mid-run) left the lock
behind, and every later CPU group, and ``make``'s build of the op, waited on it without end.

Here the load runs under a kernel lock (``flock``: released when its holder dies, however it dies). Every
evald process takes it first, so a torch lock found while holding it belongs to no evald process: it is a
build in progress only if some process works in the build folder (ninja and the compiler run there), and is
otherwise removed once it is older than the few seconds a holder spends before ninja starts.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import structlog

log = structlog.get_logger("inference.shm_op")

#: The op's name, as DeepSpeed's ShareMemCommBuilder builds it.
OP_NAME = "deepspeed_shm_comm"

#: A torch lock younger than this may belong to a process between taking it and starting ninja (it checks
#: the compiler first): it is not judged until then.
HOLDER_GRACE_SECS = 30.0

#: Older than this, a lock is stale whatever works in its folder (a shell left there, say): a first build
#: takes a minute or two on a busy node.
STALE_LOCK_SECS = 15 * 60

#: How often a lock held by a live build is looked at again.
POLL_SECS = 0.5


def build_folder(name: str = OP_NAME) -> Path:
    """The folder torch builds ``name`` in (TORCH_EXTENSIONS_DIR, else its per-Python, per-device cache)."""
    # torch's own resolution (private, but the only place that knows it: a wrong guess would miss the lock
    # that hangs); it creates the folder.
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def processes_in(folder: Path) -> list[int]:
    """Pids of live processes whose working folder is ``folder`` or below it (ninja and its compilers)."""
    found: list[int] = []
    resolved = folder.resolve()
    for proc in psutil.process_iter(["pid", "cwd"]):
        cwd = proc.info.get("cwd")
        if not cwd:
            continue
        path = Path(cwd)
        if path == resolved or resolved in path.parents:
            found.append(proc.info["pid"])
    return found


def lock_is_stale(lock: Path, *, now: float, builders: list[int]) -> bool:
    """Whether ``lock``, found while holding the kernel lock, was left by a process that is gone.

    ``builders`` are the processes working in its folder now.
    """
    try:
        age = now - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age >= STALE_LOCK_SECS:
        return True
    return age >= HOLDER_GRACE_SECS and not builders


@contextmanager
def _kernel_lock(folder: Path) -> Iterator[None]:
    with (folder / "evald.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def clear_torch_lock(folder: Path) -> None:
    """Wait out a build in progress in ``folder`` and remove a lock no build holds. Hold the kernel lock."""
    lock = folder / "lock"
    waiting = False
    while lock.exists():
        builders = processes_in(folder)
        if lock_is_stale(lock, now=time.time(), builders=builders):
            age = time.time() - lock.stat().st_mtime if lock.exists() else 0.0
            lock.unlink(missing_ok=True)
            log.warning("shm_op.stale_lock_removed", path=str(lock), age_s=round(age))
            return
        if not waiting:
            log.info("shm_op.build_in_progress", path=str(lock), builders=builders)
            waiting = True
        time.sleep(POLL_SECS)


def load() -> Any:
    """DeepSpeed's CPU shared-memory op, built if needed; later loads in this process (DeepSpeed's own in
    ``init_distributed``) take it from DeepSpeed's cache of loaded ops without touching the torch lock."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    folder = build_folder(builder.name)
    with _kernel_lock(folder):
        clear_torch_lock(folder)
        return builder.load()


def main() -> int:
    """``python -m inference.shm_op``: build the op now (``make``'s set-up), so no first job waits on it."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    load()
    print(f"evald: DeepSpeed's CPU shared-memory op is built in {build_folder()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
