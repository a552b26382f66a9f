"""The daemon's signals (SIGTERM, SIGINT, SIGHUP) answered on a thread of their own, not in a handler.

A Python signal handler runs on the main thread between two of its bytecodes, wherever that thread is.
One that logs, or sets a ``threading.Event``, while the main thread holds the same non-reentrant lock
(structlog's write lock between taking it and printing a line; an Event's condition) waits on itself
forever: the daemon then ignores that SIGTERM and every later one until systemd kills it. So the Python
handlers here do nothing; the interpreter's C-level handler writes each signal's number to a pipe
(``signal.set_wakeup_fd``), and a thread reading the pipe calls the callbacks, as any other thread would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from types import FrameType

Callback = Callable[[signal.Signals], None]


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """A Python handler must be installed for the C handler to write the wakeup byte; the work is done
    on the reading thread."""


@contextlib.contextmanager
def answered_on_a_thread(callbacks: Mapping[signal.Signals, Callback]) -> Iterator[None]:
    """Inside the block, each signal of ``callbacks`` calls its callback on a thread of its own; the
    previous handlers and wakeup fd are back after. Call from the main thread (Python's rule for
    handlers)."""
    read_end, write_end = os.pipe()
    # The C handler must never block on a full pipe; a byte lost to a full pipe is a signal already
    # queued many times over.
    os.set_blocking(write_end, False)
    reader = threading.Thread(
        target=_read, args=(read_end, dict(callbacks)), name="evald-signals", daemon=True
    )
    reader.start()
    previous_handlers = {sig: signal.signal(sig, _ignore) for sig in callbacks}
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        os.close(write_end)  # the reader reads to the end, then returns
        reader.join()
        os.close(read_end)


def _read(read_end: int, callbacks: Mapping[signal.Signals, Callback]) -> None:
    while chunk := os.read(read_end, 64):
        for sig in callbacks:
            if sig.value in chunk:
                # Once per read, however often it came: a stop or a reload asked twice is one.
                callbacks[sig](sig)
