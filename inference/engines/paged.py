"""The paged engine: continuous batching (:mod:`inference.engines.continuous`) over a pool of KV blocks
(:mod:`inference.engines.pages`) rather than whole-length slots, so a long-tailed load runs as many
sequences at once as its live tokens fit, and a pool outgrown preempts the newest sequence instead of
failing."""

from __future__ import annotations

from inference.engines.continuous import ContinuousEngine


class PagedEngine(ContinuousEngine):
    name = "paged"
    paged = True
