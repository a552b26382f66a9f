"""Real processes for end-to-end tests: the daemon, the toy trainer, and a database to watch them by."""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psutil
from sqlalchemy.engine import make_url

from storage import migrations, queries
from storage.database import Database
from storage.schema import HEAD_REVISION
from tests.deadlines import Deadline, patient, wait_process
from tests.forkserver import cli_python, worker_python

T = TypeVar("T")


class Clock:
    """A controlled monotonic clock for tests: advance ``now`` instead of sleeping."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


CONFIG = """\
[database]
url = "{url}"

[[runs]]
name = "toy"
root = "{root}"
{run_extra}

[[tasks]]
name = "arith"
dataset = "{dataset}"
prompt_field = "problem"
id_field = "id"
prompt_template = "{{prompt}}="
max_new_tokens = 12
batch_size = {batch_size}

[inference]
threads = 1
{inference_extra}

[scheduling]
quiet_secs = {quiet}
invalid_after_secs = {invalid_after}
rescan_secs = 2.0
tick_secs = 0.05
heartbeat_secs = 1.0
lease_secs = 5.0
shutdown_grace_secs = {grace}
{scheduling_extra}

[daemon]
state_dir = "{state}"
log_format = "json"
"""


def write_dataset(path: Path, n: int) -> Path:
    # The CLI's own entry point, in this process: a new interpreter per dataset cost more than the rest
    # of many a test (test_toy runs the command itself).
    from inference.toy import problems

    assert problems.main(["--out", str(path), "--n", str(n), "--seed", "3"]) == 0
    return path


def write_config(
    tmp: Path,
    url: str,
    *,
    dataset: Path,
    quiet: float = 0.5,
    invalid_after: float = 3.0,
    grace: float = 20.0,
    batch_size: int = 16,
    run_extra: str = "",
    scheduling_extra: str = "",
    inference_extra: str = "",
) -> Path:
    root = tmp / "run"
    root.mkdir(exist_ok=True)
    path = tmp / "evald.toml"
    path.write_text(
        CONFIG.format(
            url=url,
            root=root,
            dataset=dataset,
            quiet=quiet,
            invalid_after=invalid_after,
            grace=grace,
            state=tmp / "state",
            batch_size=batch_size,
            run_extra=run_extra,
            scheduling_extra=scheduling_extra,
            inference_extra=inference_extra,
        )
    )
    return path


def upgraded(url: str) -> Database:
    """``url``'s database at the newest schema. A SQLite file not made yet starts as a copy of one migrated
    once per test process (:func:`sqlite_template`): running every migration costs about 0.3 CPU-s, a
    copy a millisecond. A database already at the newest revision is left as it is; any other is
    migrated."""
    target = make_url(url)
    if target.drivername.startswith("sqlite") and target.database not in (None, "", ":memory:"):
        path = Path(str(target.database))
        if not path.exists() and path.parent.is_dir():
            shutil.copyfile(sqlite_template(), path)
    database = Database(url)
    if migrations.current_revision(database) != HEAD_REVISION:
        migrations.upgrade(database)
    return database


@functools.cache
def sqlite_template() -> Path:
    """A SQLite file migrated to head, made once per test process, in a folder removed at its exit: copy it
    (``shutil.copyfile``) for a fresh, upgraded database."""
    folder = Path(tempfile.mkdtemp(prefix="evald-sqlite-template-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "evald.db"
    database = Database(f"sqlite:///{path}")
    migrations.upgrade(database)
    database.dispose()
    # Everything into the main file, so that copying it alone copies the whole database.
    with contextlib.closing(sqlite3.connect(path)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def evald(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    # The session's CLI shim forks a short command from a process that imported its modules.
    return subprocess.run(
        [cli_python(), "-m", "daemon", *args],
        capture_output=True,
        text=True,
        timeout=patient(timeout),
        env={**os.environ, **(env or {})},
    )


class DaemonProcess:
    """``evald run`` as a process of the test's. Forked by the session's CLI server (its imports done once,
    about 2 CPU-s a daemon on a slow host) unless ``fresh``: a test that stops the daemon with SIGSTOP, or
    reads its pid where the daemon writes its own, needs the daemon itself to be the process it started
    (forked, that process is a client that passes signals on: tests/fork_client.py)."""

    def __init__(
        self, config: Path, log: Path, env: dict[str, str] | None = None, *, fresh: bool = False
    ) -> None:
        self.log = log
        self._handle = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable if fresh else cli_python(), "-m", "daemon", "--config", str(config), "run"],
            stdout=self._handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(
            lambda: b'"daemon.ready"' in self.log.read_bytes() or None,
            timeout,
            "daemon.ready in the log",
            self.process,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = wait_process(self.process, timeout)
        self._handle.close()
        return code


@contextmanager
def running_daemon(
    config: Path, log: Path, env: dict[str, str] | None = None, *, fresh: bool = False
) -> Iterator[DaemonProcess]:
    daemon = DaemonProcess(config, log, env, fresh=fresh)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()


def start_trainer(out: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    """The toy trainer writing checkpoints under ``out`` as the daemon watches: forked by the session's
    fork server (a fresh interpreter spent 6 of the test's 7 CPU-seconds importing torch)."""
    return subprocess.Popen(
        [worker_python(), "-m", "inference.toy.trainer", "--out", str(out), "--threads", "1", *args],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def wait_for(
    check: Callable[[], T | None], timeout: float, what: str, process: subprocess.Popen[bytes] | None = None
) -> T:
    # ``timeout`` is in seconds of a quiet machine: a loaded one stretches it (tests/deadlines.py).
    deadline = Deadline(timeout)
    while not deadline.expired():
        value = check()
        if value is not None and value is not False:
            return value
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode} while waiting for {what}")
        time.sleep(0.1)
    raise AssertionError(
        f"timed out after {timeout} s of a quiet machine ({deadline.waited():.0f} s) waiting for {what}"
    )


def jobs(database: Database) -> list[queries.JobRow]:
    with database.session() as session:
        return queries.job_rows(session)


def checkpoints(database: Database) -> list[queries.CheckpointRow]:
    with database.session() as session:
        return queries.checkpoint_rows(session)


def all_jobs_done(database: Database, expected: int) -> list[queries.JobRow] | None:
    rows = jobs(database)
    done = [j for j in rows if j.state in ("succeeded", "failed", "skipped")]
    return rows if len(rows) >= expected and len(done) == len(rows) else None


def worker_processes(marker: Path) -> list[psutil.Process]:
    """Every process whose command line names a path under ``marker`` (a job's state folder): the
    worker, its launcher, torchrun and each rank."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if any(str(marker) in part for part in cmdline):
            found.append(process)
    return found


def no_worker_left(marker: Path) -> None:
    """Wait until no process of a job's group (:func:`worker_processes`) is left. The daemon stops a group
    before it records the job's end, but under the session's fork server (tests/forkserver.py) its worker
    is a fork client, and the server stops and kills the forked launcher's tree once it sees the client
    gone, a moment after the daemon's kill returned: a check at once found two ranks suspended, not yet
    killed. Without the fork server (``make test-long``) the wait ends at its first look."""
    wait_for(
        lambda: not worker_processes(marker), 10, f"every process of the group under {marker} to be gone"
    )


def all_log_events(log: Path) -> list[dict[str, Any]]:
    """Every event of a daemon's JSON log, in order (lines that are not JSON, a library's, left out)."""
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return [json.loads(line) for line in lines if line.startswith("{")]


def log_events(log: Path, name: str) -> list[dict[str, Any]]:
    """The events named ``name`` in a daemon's JSON log, in order."""
    found = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


def free_port() -> int:
    """A TCP port nothing listens on now. DeepSpeed's launcher otherwise rendezvouses on 29500, which
    two groups started at once (tests on several xdist workers) would both take."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
