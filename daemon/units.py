"""Memory sizes and percentages as people write them in the config: ``"20GiB"``, ``"80%"``.

Pure. A memory threshold without a unit is refused rather than guessed: ``20`` could mean bytes or GiB,
and ``0.8`` for a utilisation could mean 0.8 % or 80 %. Error messages name the offending value and read
as the tail of ``"<field>: "``, which is how pydantic reports them.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

#: Bytes per unit, keyed by the lower-cased unit: IEC units are powers of 1024, SI units powers of 1000.
MEMORY_UNITS: dict[str, int] = {
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
KNOWN_UNITS = "KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"
#: The units ``format_bytes`` writes, largest first.
_BINARY_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_MEMORY = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z]*)\s*")
_PERCENT = re.compile(rf"\s*({_NUMBER})\s*%\s*")


def parse_memory(value: object, *, field: str | None = None) -> int:
    """Bytes from ``"20GiB"``, ``"1.5 GiB"``, ``"800MB"`` (unit case-insensitive, space optional).

    ``field``, when given, prefixes the error message (for callers that are not pydantic validators).
    """
    try:
        return _parse_memory(value)
    except ValueError as exc:
        if field is None:
            raise
        raise ValueError(f"{field}: {exc}") from None


def _parse_memory(value: object) -> int:
    # bool is an int: check it first so that ``true`` is not read as 1 of something.
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a memory size; write e.g. '20GiB' or '512MiB'")
    if not isinstance(value, str):
        raise ValueError(f"{value!r} needs a unit, e.g. '20GiB' or '512MiB'")
    if _PERCENT.fullmatch(value):
        raise ValueError(f"{value!r} is a percentage, not a memory size (write e.g. '20GiB')")
    match = _MEMORY.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a memory size; write e.g. '20GiB' or '512MiB'")
    number, unit = Decimal(match[1]), match[2]
    if not unit:
        raise ValueError(f"{value!r} needs a unit, e.g. '20GiB' or '512MiB'")
    multiplier = MEMORY_UNITS.get(unit.lower())
    if multiplier is None:
        raise ValueError(f"{value!r} has an unknown unit {unit!r}; use one of {KNOWN_UNITS}")
    if number < 0:
        raise ValueError(f"{value!r} is negative; a memory size is 0 or more")
    return int((number * multiplier).to_integral_value())


def parse_percent(value: object) -> float:
    """A percentage in 0..100 from ``"80%"``, ``"80 %"`` or a number such as ``80`` or ``12.5``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a percentage; write e.g. '80%'")
    if isinstance(value, str):
        match = _PERCENT.fullmatch(value)
        if match is None:
            raise ValueError(_not_percent_text(value))
        percent = float(match[1])
        if not 0 <= percent <= 100:
            raise ValueError(f"{value!r} is outside 0%..100%")
        return percent
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise ValueError(f"{value!r} is outside 0..100 (percent)")
    if 0 < value < 1:
        # Utilisation is often written as a fraction elsewhere; 0.8 % is almost never what was meant.
        meant = f"{value * 100:.10g}"
        raise ValueError(f"{value!r} looks like a fraction; write '{meant}%' for {meant} percent")
    return float(value)


def _not_percent_text(value: str) -> str:
    try:
        _parse_memory(value)
    except ValueError:
        pass
    else:
        return f"{value!r} is a memory size, not a percentage (write e.g. '80%')"
    if re.fullmatch(rf"\s*{_NUMBER}\s*", value):
        return f"{value!r} needs a '%' sign, e.g. '80%'"
    return f"{value!r} is not a percentage; write e.g. '80%'"


def format_bytes(n: int) -> str:
    """``"20.0 GiB"``: the largest binary unit in which ``n`` is at least 1, or ``"123 B"``."""
    for unit, size in _BINARY_UNITS:
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
