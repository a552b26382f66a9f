"""A stand-in for systemd's ``Restart=always``: keeps one ``evald run`` alive and says why it ended.

Each daemon start writes to its own log (``daemon-N.log``). When the daemon ends, the supervisor writes one
line to ``supervisor.log`` as journald would (``{"event": "supervisor.daemon_exited", "code": -9, ...}``),
counts the exit as planned (a fault the scenario injected, or the final stop) or not, and starts it again
after ``restart_secs``, as ``RestartSec=`` does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


@dataclass
class Exit:
    """One end of a daemon process."""

    number: int
    code: int
    planned: bool
    #: Seconds the process ran.
    lived_s: float


@dataclass
class Supervisor:
    config: Path
    logs: Path
    env: Mapping[str, str]
    restart_secs: float = 0.5
    exits: list[Exit] = field(default_factory=list)
    starts: int = 0

    def __post_init__(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        self._planned = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def log_paths(self) -> list[Path]:
        return sorted(self.logs.glob("daemon-*.log"), key=lambda p: int(p.stem.split("-")[1]))

    @property
    def current_log(self) -> Path:
        return self.logs / f"daemon-{self.starts}.log"

    @property
    def pid(self) -> int | None:
        with self._lock:
            process = self._process
            return process.pid if process is not None and process.poll() is None else None

    def start(self) -> Supervisor:
        self._spawn()
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def _spawn(self) -> None:
        with self._lock:
            self.starts += 1
            handle = self.current_log.open("ab")
            self._process = subprocess.Popen(
                [sys.executable, "-m", "daemon", "--config", str(self.config), "run"],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=dict(self.env),
            )
            handle.close()
            self._started_at = time.monotonic()
            self._planned = False

    def _watch(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                process = self._process
                code = process.poll() if process is not None else None
                if process is not None and code is not None:
                    self._record(code)
                    self._process = None
            if process is not None and code is not None and not self._stopping.is_set():
                time.sleep(self.restart_secs)
                if not self._stopping.is_set():
                    self._spawn()
            self._stopping.wait(0.05)

    def _record(self, code: int) -> None:
        exit_ = Exit(self.starts, code, self._planned, time.monotonic() - self._started_at)
        self.exits.append(exit_)
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"status {code}"
        line = {
            "timestamp": datetime.now(UTC).isoformat(),
            "event": "supervisor.daemon_exited",
            "start": exit_.number,
            "code": code,
            "how": how,
            "planned": exit_.planned,
            "lived_s": round(exit_.lived_s, 2),
            "restart": not self._stopping.is_set(),
        }
        with (self.logs / "supervisor.log").open("a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the current daemon logged ``daemon.ready`` (raises ``TimeoutError``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                log = self.current_log
                alive = self._process is not None
            if alive and log.exists() and b'"daemon.ready"' in log.read_bytes():
                return
            time.sleep(0.1)
        raise TimeoutError(f"no daemon.ready in {self.current_log} after {timeout:g} s")

    def kill(self, sig: int = signal.SIGKILL) -> int | None:
        """Send ``sig`` to the running daemon as a planned fault; returns its pid (None if none ran)."""
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None:
                return None
            self._planned = True
            os.kill(process.pid, sig)
            return process.pid

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGTERM the daemon and stop restarting it; returns its exit status."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            process = self._process
            if process is None:
                return None
            self._planned = True
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            self._record(code)
            self._process = None
            return code

    @property
    def unplanned_exits(self) -> list[Exit]:
        return [e for e in self.exits if not e.planned]
