"""The column types evald's values need on every backend, and the clock they are stamped with.

Core types only (no ORM): :mod:`storage.models` declares its columns with them, and the reads that must
not import the ORM (:mod:`storage.tables`) process the same columns the same way.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from sqlalchemy import DateTime, Dialect, Float, TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timestamps are aware and in UTC on every backend (SQLite would hand them back naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: evald stores UTC-aware timestamps only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class MetricFloat(TypeDecorator[float]):
    """A metric's value, NaN included: SQLite has no NaN (it would store NULL into a NOT NULL column and
    fail the whole result), so there NaN is kept as NULL and read back as NaN. PostgreSQL stores NaN."""

    impl = Float
    cache_ok = True

    def process_bind_param(self, value: float | None, dialect: Dialect) -> float | None:
        if value is not None and math.isnan(value) and dialect.name == "sqlite":
            return None
        return value

    def process_result_value(self, value: float | None, dialect: Dialect) -> float | None:
        return math.nan if value is None else value
