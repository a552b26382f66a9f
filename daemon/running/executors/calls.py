"""A scheduler's calls off the daemon's loop: ``sbatch``, ``squeue``, ``scontrol``, ``sacct`` and ``scancel``
run on worker threads, and what they said is applied on the loop by its next pass.

A Slurm tool waits for a controller that does not answer (about 8 s a call while slurmctld restarts, up to
the tools' 60 s timeout on a hung one); on the loop that wait would hold watching, storing and alerts.
So each call is a piece of *work* run on a thread (the tools, nothing else: no database, no shared
state), which returns an *apply*: what its answer does to the daemon's state, run on the loop by
:meth:`Calls.collect`. One call at a time per key (a job, the executor's check): a job is never asked
twice at once, and an answer is applied in the order of its key's calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor, wait

#: What an answer does, run on the loop.
Apply = Callable[[], None]

#: Threads for the tools: a hung ``sbatch`` holds one, the polls of the other jobs go on in the rest.
WORKERS = 4


class Calls:
    """Worker threads for a scheduler's tools (see the module's docstring)."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evald-executor")
        self._pending: dict[Hashable, Future[Apply]] = {}

    def busy(self, key: Hashable) -> bool:
        """Whether a call under ``key`` has not been applied yet."""
        return key in self._pending

    def busy_any(self, kind: str) -> bool:
        """Whether any call under a key ``(kind, ...)`` has not been applied yet."""
        return any(isinstance(k, tuple) and k and k[0] == kind for k in self._pending)

    def start(self, key: Hashable, work: Callable[[], Apply]) -> bool:
        """Run ``work`` on a thread unless a call under ``key`` is pending; False when one is."""
        if key in self._pending:
            return False
        self._pending[key] = self._pool.submit(work)
        return True

    def collect(self) -> int:
        """Apply the answers that came (on the loop); returns how many. A work that raised raises here,
        as it would have on the loop; the answers behind it are applied by the next call."""
        done = [(key, future) for key, future in self._pending.items() if future.done()]
        for key, future in done:
            del self._pending[key]
            future.result()()
        return len(done)

    def settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the calls under way, and apply their answers."""
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            wait(list(self._pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            self.collect()

    def close(self) -> None:
        """Stop taking calls; those under way end on their own (a tool's timeout bounds them)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
