"""Where a rank sits in a worker group of ``dp`` replicas of ``tp`` tensor-parallel ranks, and how the
eval set is dealt to the replicas. Pure: no torch, no processes.

Ranks are numbered replica by replica: replica ``r`` holds global ranks ``r*tp … r*tp + tp - 1``, and
the first of them (its *head*) prepares the batches, settles disagreements and holds the results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Topology:
    tp: int
    dp: int
    rank: int = 0

    def __post_init__(self) -> None:
        if self.tp < 1 or self.dp < 1 or not 0 <= self.rank < self.tp * self.dp:
            raise ValueError(f"no rank {self.rank} in a group of tp={self.tp} × dp={self.dp}")

    @property
    def world_size(self) -> int:
        return self.tp * self.dp

    @property
    def replica(self) -> int:
        return self.rank // self.tp

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_head(self) -> bool:
        return self.tp_rank == 0

    def replica_ranks(self, replica: int) -> list[int]:
        return list(range(replica * self.tp, (replica + 1) * self.tp))

    def head_of(self, replica: int) -> int:
        return replica * self.tp

    def peer_ranks(self, tp_rank: int) -> list[int]:
        """The ranks at tp position ``tp_rank`` of every replica, by replica: one rank per replica."""
        return list(range(tp_rank, self.world_size, self.tp))


def deal_by_length(lengths: Sequence[int], replicas: int) -> list[list[int]]:
    """Indices of ``lengths`` dealt to ``replicas``: counts equal to within one, and prompt lengths balanced.

    Sorted by length and dealt in snake order (0, 1, …, n-1, n-1, …, 0, 0, …), so every replica gets
    the same mix of short and long prompts and their length buckets pad alike. Each part is in index
    order; the same lengths always give the same parts, on every rank.
    """
    parts: list[list[int]] = [[] for _ in range(replicas)]
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    for position, index in enumerate(order):
        lap, offset = divmod(position, replicas)
        parts[offset if lap % 2 == 0 else replicas - 1 - offset].append(index)
    return [sorted(part) for part in parts]


def restore_order(parts: Sequence[Sequence[tuple[int, T]]], total: int) -> list[T]:
    """Merge ``(index, value)`` pairs from every replica back into index order; every index exactly once."""
    merged: dict[int, T] = {}
    for part in parts:
        for index, value in part:
            if index in merged:
                raise ValueError(f"item {index} came back from two replicas")
            merged[index] = value
    missing = sorted(set(range(total)) - merged.keys())
    if missing:
        raise ValueError(f"items {missing[:5]} came back from no replica")
    return [merged[i] for i in range(total)]


def use_shm_all_reduce(*, dp: int, world_size: int, local_world_size: int) -> bool:
    """Whether DeepSpeed's CPU shared-memory all-reduce may stay on.

    The op reduces over every rank of the node, whatever group it is called for, so it is only right
    when one tp group is the whole world on one node: with dp > 1 it would sum across replicas, and
    across nodes it would read buffers no peer wrote.
    """
    return dp == 1 and world_size == local_world_size
