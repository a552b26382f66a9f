"""systemd's notification protocol (``Type=notify``): READY once watching, WATCHDOG from the main loop."""

from __future__ import annotations

import os
import time

import sdnotify


class SystemdNotifier:
    """Sends nothing unless systemd set ``NOTIFY_SOCKET``; pings the watchdog at most twice per interval."""

    def __init__(self) -> None:
        self._notifier = sdnotify.SystemdNotifier() if os.environ.get("NOTIFY_SOCKET") else None
        usec = os.environ.get("WATCHDOG_USEC", "")
        self._interval = int(usec) / 2e6 if usec.isdigit() else None
        self._last = 0.0

    def _send(self, message: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(message)

    def ready(self) -> None:
        self._send("READY=1")

    def status(self, text: str) -> None:
        self._send(f"STATUS={text}")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def watchdog(self) -> None:
        now = time.monotonic()
        if self._interval is not None and now - self._last >= self._interval:
            self._send("WATCHDOG=1")
            self._last = now
