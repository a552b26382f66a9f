"""Faults a test can inject into a real worker through its environment, for paths real hardware takes
rarely: a device too small for the batch, a tp rank that computes different tokens. Unset, they do
nothing; the daemon never sets them."""

from __future__ import annotations

import os
from dataclasses import dataclass

#: A batch of more sequences than this raises torch's own ``OutOfMemoryError``.
OOM_ABOVE_ENV = "EVALD_SIMULATE_OOM_ABOVE_BATCH"
#: This tp rank (within its replica) sees every row of its first batch end at the first step, and
#: changes that batch's tokens before the consistency vote.
DIVERGE_ENV = "EVALD_SIMULATE_DIVERGENT_TP_RANK"


@dataclass(frozen=True)
class Faults:
    oom_above_batch: int | None = None
    divergent_tp_rank: int | None = None

    @classmethod
    def from_environment(cls) -> Faults:
        return cls(oom_above_batch=_number(OOM_ABOVE_ENV), divergent_tp_rank=_number(DIVERGE_ENV))


def _number(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else None
