"""The pure parts of a worker group: ranks, dealing items to replicas, merging them back, the tp vote."""

from __future__ import annotations

import pytest

from inference.consistency import settle, token_digest
from inference.topology import Topology, deal_by_length, restore_order, use_shm_all_reduce


def test_ranks_are_numbered_replica_by_replica() -> None:
    ranks = [Topology(tp=2, dp=3, rank=r) for r in range(6)]
    assert [(t.replica, t.tp_rank, t.is_head) for t in ranks] == [
        (0, 0, True), (0, 1, False), (1, 0, True), (1, 1, False), (2, 0, True), (2, 1, False)
    ]  # fmt: skip
    assert ranks[3].replica_ranks(1) == [2, 3]
    assert ranks[0].head_of(2) == 4
    # A rank's peers: the same tp position in every replica (lm-eval's replicas gather over them).
    assert [ranks[0].peer_ranks(t) for t in range(2)] == [[0, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError, match="no rank 6 in a group of tp=2 × dp=3"):
        Topology(tp=2, dp=3, rank=6)


def test_dealing_balances_counts_and_lengths_and_covers_every_item() -> None:
    lengths = [5, 50, 7, 40, 8, 33, 9, 31, 10, 12, 60, 6]
    parts = deal_by_length(lengths, 3)

    assert sorted(i for part in parts for i in part) == list(range(len(lengths)))
    assert [len(part) for part in parts] == [4, 4, 4]
    # Each replica gets one prompt from each quarter of the length order: its totals stay close.
    totals = [sum(lengths[i] for i in part) for part in parts]
    assert max(totals) - min(totals) <= 15  # a contiguous split by length would differ by 157
    assert all(part == sorted(part) for part in parts)
    assert deal_by_length(lengths, 3) == parts  # every rank computes the same parts
    assert sorted(len(part) for part in deal_by_length(lengths[:11], 3)) == [3, 4, 4]


def test_dealing_to_one_replica_keeps_everything_in_order() -> None:
    assert deal_by_length([3, 1, 2], 1) == [[0, 1, 2]]
    assert deal_by_length([], 2) == [[], []]


def test_restore_order_merges_replicas_and_refuses_gaps_and_repeats() -> None:
    assert restore_order([[(1, "b"), (3, "d")], [(0, "a"), (2, "c")]], 4) == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match=r"items \[2\] came back from no replica"):
        restore_order([[(0, "a")], [(1, "b")]], 3)
    with pytest.raises(ValueError, match="item 0 came back from two replicas"):
        restore_order([[(0, "a")], [(0, "a")]], 1)


@pytest.mark.parametrize(
    ("dp", "world", "local", "expected"),
    [(1, 2, 2, True), (2, 4, 4, False), (1, 4, 2, False), (1, 1, 1, True)],
)
def test_shm_all_reduce_only_when_one_tp_group_is_the_whole_node(
    dp: int, world: int, local: int, expected: bool
) -> None:
    assert use_shm_all_reduce(dp=dp, world_size=world, local_world_size=local) is expected


def test_token_digest_sees_every_token_and_row_boundary() -> None:
    base = token_digest([[1, 2], [3]])
    assert token_digest([[1, 2], [3]]) == base
    assert token_digest([[1], [2, 3]]) != base
    assert token_digest([[1, 2], [4]]) != base
    assert token_digest([[1, 2, 3]]) != base


def test_settle_agreement_majority_and_tie() -> None:
    agreed = settle(["a", "a", "a"])
    assert (agreed.winner, agreed.outvoted, agreed.tie, agreed.agreed) == (0, (), False, True)

    head_outvoted = settle(["x", "a", "a"])
    assert (head_outvoted.winner, head_outvoted.outvoted, head_outvoted.tie) == (1, (0,), False)

    tie = settle(["a", "b"])
    assert (tie.winner, tie.outvoted, tie.tie) == (0, (1,), True)

    no_majority = settle(["a", "a", "b", "b"])
    assert (no_majority.winner, no_majority.outvoted, no_majority.tie) == (0, (2, 3), True)

    plurality_is_not_majority = settle(["b", "a", "a", "c", "d"])
    assert (plurality_is_not_majority.winner, plurality_is_not_majority.tie) == (0, True)

    with pytest.raises(ValueError, match="no digests"):
        settle([])
