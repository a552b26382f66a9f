"""Database outages as the daemon lives through them: one log line when one starts, one when it ends.

The daemon's threads (the main loop, the alert relay) each report the failures they see; whoever sees the
first logs ``db.unavailable``. Only the main loop reports success, when a whole pass got through (the
work that failed included) and reached the database (while an outage lasts each pass asks it first: an
idle pass touches none, and once ended the outage while the server was still down, so that the relay's
next failure logged a second one): a read that works while writes still fail (a full disk) is no
recovery. Then ``db.recovered`` says how long it lasted, so an outage is two lines however many passes
and threads it spans. ``up_secs`` is how long the database has answered since: leases are judged on it.
Retries wait longer each time, up to a cap, with jitter so daemons sharing a server do not all knock at
once when it comes back.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("evald.database")

#: The first wait after a failure, doubled each time up to the cap.
FIRST_WAIT_SECS = 0.25


def backoff(failures: int, cap: float, rng: random.Random) -> float:
    """Wait before try ``failures + 1``: exponential from ``FIRST_WAIT_SECS``, capped, full jitter in the
    upper half (never zero, never above ``cap``)."""
    ceiling = min(cap, FIRST_WAIT_SECS * 2.0 ** max(failures - 1, 0))
    return ceiling / 2 + rng.random() * ceiling / 2


class Outage:
    """Thread-safe record of whether the database is away, shared by everything that talks to it."""

    def __init__(
        self,
        *,
        cap_secs: float,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._cap = cap_secs
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0
        #: When the database last came back (or this record was made): how long it has been up.
        self._up_since = clock()

    @property
    def active(self) -> bool:
        return self._since is not None

    @property
    def up_secs(self) -> float:
        """How long the database has answered since the last outage ended (0 during one): what a lease
        is judged against, since nobody could beat while it was away."""
        with self._lock:
            if self._since is not None:
                return 0.0
            return self._clock() - self._up_since

    def failed(self, error: BaseException, *, where: str) -> float:
        """Note a failure (logged if it starts an outage); returns how long to wait before trying again."""
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since = self._clock()
                log.error("db.unavailable", where=where, error=str(error))
            return backoff(self._failures, self._cap, self._rng)

    def succeeded(self) -> bool:
        """Note a success; True (and ``db.recovered`` logged) when it ends an outage."""
        with self._lock:
            if self._since is None:
                return False
            lasted = self._clock() - self._since
            log.info("db.recovered", outage_secs=round(lasted, 2), failed_tries=self._failures)
            self._since = None
            self._failures = 0
            self._up_since = self._clock()
            return True
