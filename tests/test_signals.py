"""The daemon's signals are answered on a thread, so a SIGTERM arriving while the main thread holds the
log's write lock stops it (a handler that logged on the main thread waited on itself forever: stop 40's
CI saw a daemon ignore SIGTERM for 60 s right after a job's result)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.deadlines import patient

CHILD = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import structlog
    from structlog._output import WRITE_LOCKS
    from daemon.service.signals import answered_on_a_thread

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stdout))
    log = structlog.get_logger()
    log.info("first")  # the write lock of stdout exists from here
    stopped, reloaded = threading.Event(), threading.Event()

    def stop(sig):
        log.info("daemon.stopping", signal=sig.name)
        stopped.set()

    def reload(sig):
        reloaded.set()

    with answered_on_a_thread({signal.SIGTERM: stop, signal.SIGHUP: reload}):
        # The main thread in the middle of a log line, as the daemon is when a signal comes.
        with WRITE_LOCKS[sys.stdout]:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # bytecodes run here: a Python-level handler would run now, and hang
            mid_line = stopped.is_set()
        os.kill(os.getpid(), signal.SIGHUP)
        answered = stopped.wait(10) and reloaded.wait(10)
    print(f"mid_line={mid_line} answered={answered}", flush=True)
    # The previous handlers are back: SIGTERM's default ends the process.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    """
)


def test_a_sigterm_while_the_main_thread_holds_the_log_lock_is_answered_after_it() -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=patient(60), check=False
    )
    assert "mid_line=False answered=True" in child.stdout, child.stdout + child.stderr
    assert "daemon.stopping" in child.stdout
    assert child.returncode == -15, child.stderr
