"""When to try again: an exponential backoff with jitter, and a receiver's ``Retry-After``."""

from __future__ import annotations

import email.utils
import random
import re
from datetime import UTC, datetime

#: A Retry-After longer than this is not waited for in full: the message is tried again then.
MAX_RETRY_AFTER_SECS = 3600.0


def backoff(attempts: int, cap: float, rng: random.Random) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 1, 2, 4, ... up to ``cap``, each between
    half and all of it (jitter, so that endpoints recovering together are not hit in lockstep)."""
    # The exponent capped: after a week of outage 2 ** attempts would overflow a float.
    return min(cap, 2.0 ** min(max(0, attempts - 1), 60)) * rng.uniform(0.5, 1.0)


def retry_after(value: str | None, now: datetime) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if re.fullmatch(r"[0-9]{1,9}", value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def delay(attempts: int, cap: float, rng: random.Random, hinted: float | None) -> float:
    """:func:`backoff`, or the receiver's ``Retry-After`` (``hinted``) where that is longer, up to
    :data:`MAX_RETRY_AFTER_SECS`."""
    wait = backoff(attempts, cap, rng)
    if hinted is not None:
        wait = max(wait, min(hinted, MAX_RETRY_AFTER_SECS))
    return wait
