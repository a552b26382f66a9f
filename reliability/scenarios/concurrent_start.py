"""Two daemons started at the same moment on a fresh PostgreSQL database, again and again.

Each try makes a new database on a private server (``tests.pgcluster``), writes one config per daemon
(the same run, each its own state folder) and starts both ``python -m daemon run`` processes at once.
Before the start-up writes were idempotent one of the two died on the runs table's unique name in 2 of 15
tries. A try counts a crash for each daemon that exits before it is ready; both are then stopped with
SIGTERM and must exit 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from reliability.figures import Figures
from reliability.scenarios.base import Options
from reliability.workspace import write_dataset
from storage import migrations
from storage.database import Database
from tests.harness import write_config
from tests.pgcluster import start_cluster

READY_TIMEOUT_SECS = 120.0


def _ready_or_exited(process: subprocess.Popen[bytes], log: Path, deadline: float) -> bool:
    """True once the daemon logged ``daemon.ready``; False if it exited (or the deadline passed) first."""
    while time.monotonic() < deadline:
        if b'"daemon.ready"' in log.read_bytes():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def run(options: Options) -> Figures:
    tries = options.pick(short=3, full=15)
    figures = Figures("two daemons started at once")
    figures.faults["simultaneous start"] = tries
    started = time.monotonic()
    cluster = start_cluster()
    folder = Path(tempfile.mkdtemp(prefix="evald-reliability-start-", dir=options.workdir))
    data = write_dataset(folder / "arith.jsonl", 4)
    try:
        for attempt in range(tries):
            url = cluster.create_database(f"evald_start_{attempt}")
            database = Database(url)
            migrations.upgrade(database)
            database.dispose()
            root = folder / f"try-{attempt}" / "run"
            root.mkdir(parents=True)
            processes, logs = [], []
            for name in ("a", "b"):
                home = folder / f"try-{attempt}" / name
                home.mkdir()
                config = write_config(home, url, dataset=data)
                config.write_text(config.read_text().replace(f'"{home / "run"}"', f'"{root}"'))
                log = home / "daemon.log"
                logs.append(log)
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "daemon", "--config", str(config), "run"],
                        stdout=log.open("wb"),
                        stderr=subprocess.STDOUT,
                        env={**os.environ, "HF_HUB_OFFLINE": "1"},
                    )
                )
            figures.daemon_starts += 2
            deadline = time.monotonic() + READY_TIMEOUT_SECS
            for process, log in zip(processes, logs, strict=True):
                if not _ready_or_exited(process, log, deadline):
                    figures.daemon_crashes += 1
                    tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                    figures.notes.append(f"try {attempt}: a daemon exited {process.poll()}: {tail[0][:300]}")
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                code = process.wait(timeout=60)
                if code not in (0, None) and not figures.notes:
                    figures.notes.append(f"try {attempt}: a daemon exited {code} on SIGTERM")
    finally:
        cluster.destroy()
        if options.workdir is None:
            shutil.rmtree(folder, ignore_errors=True)
    figures.notes.append(f"{tries} tries, {figures.daemon_crashes} daemon(s) died before ready")
    figures.seconds = time.monotonic() - started
    return figures
