"""bwrap's own account of a sandbox (``--json-status-fd``), written from outside the sandbox: whether its
setup finished and the command ran, and the host pid of its PID 1 (pure, but for :func:`await_gone`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

#: How long a killed sandbox's PID 1 may take to go (it waits for every process in its namespace).
REAP_S = 5.0


def _documents(text: bytes) -> list[dict[str, object]]:
    """bwrap's ``--json-status-fd`` documents: ``child-pid`` once the namespaces exist, ``exit-code`` once
    its setup has finished and the command has ended."""
    decoded = text.decode("utf-8", "replace")
    documents: list[dict[str, object]] = []
    decoder = json.JSONDecoder()
    position = 0
    while True:
        while position < len(decoded) and decoded[position].isspace():
            position += 1
        if position >= len(decoded):
            return documents
        try:
            found, position = decoder.raw_decode(decoded, position)
        except ValueError:
            return documents
        if isinstance(found, dict):
            documents.append(found)


def started(status: bytes) -> bool:
    """Whether bwrap finished its setup and ran the command (it reports the command's exit code only
    then; a failed mount or namespace never gets one)."""
    return any("exit-code" in document for document in _documents(status))


def child_pid(status: bytes) -> int | None:
    """The host pid of the sandbox's PID 1, from bwrap's status."""
    pid = next((d.get("child-pid") for d in _documents(status) if "child-pid" in d), None)
    return pid if isinstance(pid, int) else None


def await_gone(pid: int | None) -> None:
    """Wait until ``pid`` has exited: a namespace's PID 1 exits only once every process in it has."""
    if pid is None:
        return
    deadline = time.monotonic() + REAP_S
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.005)
