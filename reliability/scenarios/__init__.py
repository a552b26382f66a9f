"""The reliability scenarios, by name: each takes :class:`~reliability.scenarios.base.Options` and returns
its :class:`~reliability.figures.Figures`. Each module's docstring says what it injects."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from reliability.figures import Figures
from reliability.scenarios.base import Options

#: Name on the command line → module, in the order a full run takes them.
SCENARIOS = {
    "kills": "reliability.scenarios.kills",
    "postgres": "reliability.scenarios.postgres",
    "webhooks": "reliability.scenarios.webhooks",
    "slow-writers": "reliability.scenarios.slow_writers",
    "disk-full-db": "reliability.scenarios.disk_full:run_database",
    "disk-full-scratch": "reliability.scenarios.disk_full:run_scratch",
    "deleted-checkpoint": "reliability.scenarios.deleted_checkpoint",
    "concurrent-start": "reliability.scenarios.concurrent_start",
    "poison-items-sqlite": "reliability.scenarios.poison_items:run_sqlite",
    "poison-items-postgres": "reliability.scenarios.poison_items:run_postgres",
    "lease-outage": "reliability.scenarios.lease_outage",
    "read-boundary": "reliability.scenarios.read_boundary",
}


def scenario(name: str) -> Callable[[Options], Figures]:
    if name not in SCENARIOS:
        raise KeyError(f"no scenario {name!r}; there are: {', '.join(SCENARIOS)}")
    module, _, function = SCENARIOS[name].partition(":")
    run: Callable[[Options], Figures] = getattr(importlib.import_module(module), function or "run")
    return run
