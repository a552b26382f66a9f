"""The tp ranks of a replica must generate the same tokens: each hashes its token ids per batch, the
digests are compared, and a disagreement is settled by strict majority (the tp head wins a tie).
Pure: no torch."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


def token_digest(rows: Sequence[Sequence[int]]) -> str:
    """A digest of a batch's generated token ids, row boundaries included."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(len(row).to_bytes(4, "little"))
        digest.update(b"".join(int(token).to_bytes(8, "little", signed=True) for token in row))
    return digest.hexdigest()


@dataclass(frozen=True)
class Verdict:
    #: tp rank whose tokens are kept.
    winner: int
    #: tp ranks whose tokens differ from the winner's.
    outvoted: tuple[int, ...]
    #: No digest had a strict majority.
    tie: bool

    @property
    def agreed(self) -> bool:
        return not self.outvoted


def settle(digests: Sequence[str]) -> Verdict:
    """The winning tp rank for one batch, given each tp rank's digest (index = tp rank)."""
    if not digests:
        raise ValueError("no digests to compare")
    top, votes = Counter(digests).most_common(1)[0]
    tie = votes * 2 <= len(digests) and len(set(digests)) > 1
    winning = digests[0] if tie else top
    winner = digests.index(winning)
    outvoted = tuple(rank for rank, digest in enumerate(digests) if digest != winning)
    return Verdict(winner=winner, outvoted=outvoted, tie=tie)
