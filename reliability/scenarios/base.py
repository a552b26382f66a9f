"""What every scenario gets: its size (short for CI, full for ``make reliability``), a seed, a folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    short: bool
    seed: int = 13
    #: Where scenario folders are kept (logs, database, outputs); None: temporary, removed after.
    workdir: Path | None = None

    def pick(self, *, short: T, full: T) -> T:
        return short if self.short else full
