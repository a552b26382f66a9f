"""Query-string parsing for the API: every bad parameter is a 400 that names it.

Parameters a route does not know are refused too, so a typo (``?metrc=``) is an error rather than a
silently unfiltered answer.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from starlette.datastructures import QueryParams

from daemon import filter_values
from daemon.errors import EvaldError
from daemon.filter_values import MAX_INT, ValueRefused, shown, step_range_problem

#: A plain decimal number (``0.05``, ``.1``, ``5e-2``): no sign, spaces, ``nan`` or ``inf``.
DECIMAL = re.compile(r"\d*\.?\d+(?:[eE][-+]?\d+)?", re.ASCII)

#: Rows one page may hold; a larger ``limit`` is refused (400), not silently cut.
MAX_LIMIT = 10_000
DEFAULT_LIMIT = 1_000


def check_text(name: str, value: str) -> str:
    """``value`` if it is text a name could be (:func:`daemon.filter_values.check_text`, the CLI's rule)."""
    try:
        return filter_values.check_text(value)
    except ValueRefused as exc:
        raise bad(name, str(exc)) from None


class ApiError(EvaldError):
    """An answer other than 200: its status and a message naming what was wrong and what exists."""

    def __init__(self, status: int, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.parameter = parameter


def bad(parameter: str, message: str) -> ApiError:
    return ApiError(400, f"parameter {parameter!r}: {message}", parameter=parameter)


@dataclass(frozen=True)
class Params:
    """A request's query parameters, checked against what its route accepts."""

    values: dict[str, str]

    @classmethod
    def parse(cls, query: QueryParams, accepted: Collection[str]) -> Params:
        values: dict[str, str] = {}
        for name, value in query.multi_items():
            if name not in accepted:
                shown = ", ".join(sorted(accepted)) or "none"
                raise ApiError(
                    400, f"unknown parameter {name[:60]!r} (accepted: {shown})", parameter=name[:60]
                )
            if name in values:
                raise bad(name, "given more than once")
            values[name] = value
        return cls(values)

    def text(self, name: str) -> str | None:
        value = self.values.get(name)
        return None if value is None else check_text(name, value)

    def choice(self, name: str, choices: Sequence[str]) -> str | None:
        value = self.text(name)
        if value is not None and value not in choices:
            raise bad(name, f"{shown(value)} is not one of {', '.join(choices)}")
        return value

    def integer(self, name: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int | None:
        value = self.values.get(name)
        if value is None:
            return None
        try:
            return filter_values.parse_integer(value, minimum=minimum, maximum=maximum)
        except ValueRefused as exc:
            raise bad(name, str(exc)) from None

    def fraction(self, name: str, default: float) -> float:
        """A number strictly between 0 and 1 (a false discovery rate), ``default`` when not given."""
        value = self.values.get(name)
        if value is None:
            return default
        if not DECIMAL.fullmatch(value):
            raise bad(name, f"{shown(value)} is not a number (e.g. 0.05)")
        number = float(value)
        if not 0 < number < 1:
            raise bad(name, f"{shown(value)} is not between 0 and 1 (e.g. 0.05)")
        return number

    def boolean(self, name: str) -> bool:
        value = self.values.get(name)
        if value is None:
            return False
        lowered = value.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise bad(name, f"{shown(value)} is not a boolean (true or false)")

    def step_range(self) -> tuple[int | None, int | None]:
        """``step_min`` and ``step_max`` (inclusive), refused when the lower is above the upper: every
        route that takes a step range reads it here, so each refuses the same way."""
        step_min, step_max = self.integer("step_min"), self.integer("step_max")
        problem = step_range_problem(step_min, step_max)
        if problem is not None:
            raise bad("step_min", problem)
        return step_min, step_max

    def page(self) -> Page:
        limit = self.integer("limit", minimum=1, maximum=MAX_LIMIT)
        offset = self.integer("offset") or 0
        return Page(limit=DEFAULT_LIMIT if limit is None else limit, offset=offset)


PAGE = ("limit", "offset")
STEPS = ("step_min", "step_max")


@dataclass(frozen=True)
class Page:
    limit: int
    offset: int
