"""Errors that come back pass after pass, logged so that a person reads the first and counts the rest.

A bug in one pass of the main loop meets the same input again in the next: its traceback logged every
second is kilobytes a second of the same lines, and buries whatever else the log says. The first time an
error is seen (the event, the exception's type and the line that raised it) it is logged with its
traceback; after that, one short line saying how many times it came back, at most once per
``every_secs``.
"""

from __future__ import annotations

import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from daemon.analysis.report.cells import one_line

#: How often a recurring error is counted in the log.
REPEAT_LOG_SECS = 60.0
#: How many distinct errors are remembered (the oldest is forgotten first).
REMEMBERED = 256
#: How much of a repeated error's text its short line keeps.
ERROR_CHARS = 300

Key = tuple[str, str, str, int, tuple[tuple[str, str], ...]]


@dataclass
class _Seen:
    count: int
    first_at: float
    logged_at: float
    logged_count: int


def origin(exc: BaseException) -> tuple[str, int]:
    """The file and line that raised ``exc`` (its traceback's innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ("?", 0)
    last = frames[-1]
    return (last.filename, last.lineno or 0)


class RepeatedErrors:
    """Not thread-safe: one per thread that logs through it (the main loop)."""

    def __init__(
        self,
        logger: Any,
        *,
        every_secs: float = REPEAT_LOG_SECS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._every = every_secs
        self._clock = clock
        self._seen: OrderedDict[Key, _Seen] = OrderedDict()

    def failed(self, event: str, exc: BaseException, **fields: Any) -> bool:
        """Log ``exc`` under ``event``: with its traceback the first time, then counted. Returns whether a
        line was written."""
        where, line = origin(exc)
        key: Key = (
            event,
            type(exc).__qualname__,
            where,
            line,
            tuple(sorted((k, str(v)) for k, v in fields.items())),
        )
        now = self._clock()
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = _Seen(count=1, first_at=now, logged_at=now, logged_count=1)
            while len(self._seen) > REMEMBERED:
                self._seen.popitem(last=False)
            self._log.error(event, error=repr(exc), exc_info=exc, **fields)
            return True
        self._seen.move_to_end(key)
        seen.count += 1
        if now - seen.logged_at < self._every:
            return False
        self._log.error(
            event,
            error=one_line(repr(exc), ERROR_CHARS),
            repeated=seen.count,
            since_last_line=seen.count - seen.logged_count,
            first_secs_ago=round(now - seen.first_at),
            traceback="logged with the first occurrence",
            **fields,
        )
        seen.logged_at = now
        seen.logged_count = seen.count
        return True
