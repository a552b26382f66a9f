"""What a filter value may be: a run, task, stage or metric name, a step, a step range.

One set of rules for the HTTP API (:mod:`daemon.web.params`, a 400 naming the parameter) and the CLI
(``--run``, ``--step``, ``--steps``: exit 2 naming the option), so neither hands the database a value
the other refuses: text it cannot encode (``--run $'\\xff'``) or a step beyond PostgreSQL's INTEGER
(``--step 99999999999999999999``: OverflowError on SQLite, NumericValueOutOfRange on PostgreSQL).
"""

from __future__ import annotations

import re

from daemon.errors import EvaldError

#: The longest text a filter may be (run names are at most 200 characters in the database).
MAX_TEXT = 500
#: The largest step or offset accepted (PostgreSQL's integer; larger would be a database error).
MAX_INT = 2**31 - 1

#: Plain ASCII digits (``str.isdigit`` also takes "²" and other digits ``int`` refuses).
INTEGER = re.compile(r"-?[0-9]{1,12}")
#: Digits too many for :data:`INTEGER`: a number still, only out of range (``int`` of thousands of
#: digits is refused by Python itself, so it is never parsed).
_LONG_INTEGER = re.compile(r"-?[0-9]+")


class ValueRefused(EvaldError):
    """A filter value that is refused; the message says why, without the parameter's name (each caller
    names it its own way: ``parameter 'step_min'``, ``--step-min``)."""


def shown(value: str, limit: int = 60) -> str:
    """``value`` quoted for a message: cut to ``limit`` characters, bytes that are not UTF-8 (which the
    CLI's argv carries as surrogates) as ``\\xff``, control characters escaped."""
    raw = value[:limit].encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return repr(raw).replace("\\\\x", "\\x")


def check_text(value: str) -> str:
    """``value`` if it is text a name could be: not empty, not too long, UTF-8, no control characters."""
    if not value:
        raise ValueRefused("empty (leave it out to mean any)")
    if len(value) > MAX_TEXT:
        raise ValueRefused(f"longer than {MAX_TEXT} characters")
    # Undecodable bytes arrive as U+FFFD from a query string and as lone surrogates from argv; NUL and
    # other control characters no name contains (and PostgreSQL refuses NUL in text outright).
    if any(c == "\ufffd" or "\ud800" <= c <= "\udfff" or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueRefused(f"{shown(value)} is not valid UTF-8 text, or holds control characters")
    return value


def parse_integer(text: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """``text`` as an integer in ``minimum..maximum``: plain ASCII digits, an optional minus."""
    if not INTEGER.fullmatch(text):
        if _LONG_INTEGER.fullmatch(text):
            cut = text if len(text) <= 40 else text[:40] + "..."
            raise ValueRefused(f"{cut} is outside {minimum}..{maximum}")
        raise ValueRefused(f"{shown(text)} is not an integer")
    number = int(text)
    if not minimum <= number <= maximum:
        raise ValueRefused(f"{number} is outside {minimum}..{maximum}")
    return number


def step_range_problem(step_min: int | None, step_max: int | None) -> str | None:
    """Why an inclusive step range is refused (the lower bound above the upper), or None."""
    if step_min is not None and step_max is not None and step_min > step_max:
        return f"{step_min} is above step_max {step_max}"
    return None
