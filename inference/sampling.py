"""Fixed, seeded, stratified subsets of an evaluation set.

A quick evaluation stage scores the same subset at every checkpoint, so its series is comparable from one
checkpoint to the next. The subset therefore depends only on the items, the size, the seed and the strata:
never on the process, the Python hash seed or the order in which a set happens to iterate.

Each stratum gets its share of ``size`` by largest remainder (ties to the smaller stratum name), and every
stratum gets at least one item when ``size`` allows one each. Within a stratum the items are shuffled by a
generator seeded from ``seed`` and the stratum name, and the first ones taken: a larger ``size`` keeps the
items a smaller one picked wherever the stratum's share does not shrink.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")


def allocate(counts: Mapping[str, int], size: int) -> dict[str, int]:
    """How many of ``size`` items each stratum gets, given how many items each stratum has.

    Proportional by largest remainder; when ``size`` is at least the number of strata, a stratum left
    without an item takes one from the stratum holding the most (ties to the smaller name).
    """
    if size < 0:
        raise ValueError(f"size must be at least 0, got {size}")
    total = sum(counts.values())
    if size >= total:
        return dict(counts)
    names = sorted(counts)
    # Integer arithmetic: a float share could round differently and break a tie on another machine.
    shares = {name: divmod(size * counts[name], total) for name in names}
    quotas = {name: shares[name][0] for name in names}
    by_remainder = sorted(names, key=lambda name: (-shares[name][1], name))
    for name in by_remainder[: size - sum(quotas.values())]:
        quotas[name] += 1
    if size >= len(names):
        for name in names:
            if quotas[name] == 0:
                # Some stratum holds two or more: fewer than all strata share at least one item each.
                donor = min(names, key=lambda other: (-quotas[other], other))
                quotas[donor] -= 1
                quotas[name] = 1
    return quotas


def stratified_subset(
    items: Sequence[T], size: int, *, seed: int, stratum: Callable[[T], str] | None = None
) -> list[T]:
    """``size`` of ``items``, chosen by ``seed`` across the strata ``stratum`` puts them in, in their order.

    All of ``items`` when ``size`` is at least their number; one plain seeded sample when ``stratum`` is
    ``None``.
    """
    if size >= len(items):
        return list(items)
    key: Callable[[T], str] = (lambda _: "") if stratum is None else stratum
    members: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        members.setdefault(key(item), []).append(index)
    quotas = allocate({name: len(indices) for name, indices in members.items()}, size)
    chosen: list[int] = []
    for name in sorted(members):
        indices = list(members[name])
        # A str seed is hashed with SHA-512, not hash(): the same on every process and platform.
        random.Random(f"{seed}:{name}").shuffle(indices)
        chosen.extend(indices[: quotas[name]])
    return [items[index] for index in sorted(chosen)]
