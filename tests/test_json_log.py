"""Every line of ``evald run``'s log is JSON when it is not a terminal: the standard library's records
(psycopg's, SQLAlchemy's pool), Python's warnings and the tracebacks Python prints itself go through the
same renderer as evald's own events."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.deadlines import patient
from tests.harness import DaemonProcess, upgraded, wait_for, write_config, write_dataset

#: A POSIX time zone PostgreSQL accepts and Python's zoneinfo does not: psycopg warns, on its own
#: logger, the first time it reads a timestamp with time zone ("unknown PostgreSQL timezone").
POSIX_ZONE = "XYZ5"


def _lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as JSON; a line that is not fails the test, naming it."""
    parsed = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            raise AssertionError(f"line {number} is not JSON: {line!r}") from None
    return parsed


@pytest.mark.postgres
def test_a_psycopg_warning_in_evald_runs_log_is_a_json_line(postgres_url: str, tmp_path: Path) -> None:
    upgraded(postgres_url).dispose()
    config = write_config(tmp_path, postgres_url, dataset=write_dataset(tmp_path / "arith.jsonl", 2))
    log = tmp_path / "daemon.log"
    # libpq sets the session's TimeZone from PGTZ; stdout and stderr both go to the log.
    daemon = DaemonProcess(config, log, {"PGTZ": POSIX_ZONE})
    try:
        daemon.wait_ready()
        wait_for(lambda: b'"logger": "psycopg"' in log.read_bytes() or None, 60, "psycopg's warning")
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
    lines = _lines(log.read_text())
    [warning] = [line for line in lines if line.get("logger") == "psycopg"]
    assert warning["level"] == "warning"
    assert warning["event"] == f"unknown PostgreSQL timezone: {POSIX_ZONE!r}; will use UTC"
    assert "timestamp" in warning
    assert {"daemon.ready", "daemon.stopped"} <= {line["event"] for line in lines}


def test_warnings_library_errors_and_thread_crashes_are_json_lines(tmp_path: Path) -> None:
    program = textwrap.dedent(
        """
        import logging, sys, threading, warnings
        from daemon import log

        log.configure(sys.stderr)  # evald's main(), then the command's own set-up:
        log.configure(sys.stdout, fmt="auto")
        warnings.warn("the old way is deprecated", UserWarning)
        logging.getLogger("apscheduler.scheduler").info("below WARNING: not shown")
        try:
            raise ConnectionResetError("server closed the connection unexpectedly")
        except ConnectionResetError:
            logging.getLogger("sqlalchemy.pool.impl.QueuePool").error("Exception during reset", exc_info=True)
        thread = threading.Thread(target=lambda: 1 / 0, name="watcher")
        thread.start()
        thread.join()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=patient(60),
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    warning, pool, crash = _lines(done.stdout)
    assert warning["logger"] == "py.warnings" and warning["level"] == "warning"
    assert warning["event"].endswith("UserWarning: the old way is deprecated")
    assert pool["logger"] == "sqlalchemy.pool.impl.QueuePool" and pool["level"] == "error"
    assert pool["exception"].endswith("ConnectionResetError: server closed the connection unexpectedly")
    assert crash["event"] == "thread.crashed" and crash["thread"] == "watcher"
    assert crash["exception"].endswith("ZeroDivisionError: division by zero")
