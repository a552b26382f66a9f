"""When each generated row ends, decided the same way on every tp rank of a replica.

``generate`` would stop each rank on its own view (EOS, stop strings); if the views ever differ, one
rank leaves the decoding loop while its peers wait in the next forward pass's all-reduce, and the group
hangs. :class:`RowEnds` replaces generate's own EOS rule: each rank states which rows have ended, the
replica votes per row (``vote``: the majority, the tp head on a tie), and every rank applies the
verdict, so all leave the loop at the same step. It also records where each row ended. A row whose own
token budget (``budgets``) is below the batch's ends when it is used up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from transformers import PreTrainedTokenizerBase
from transformers.generation.stopping_criteria import StoppingCriteria, StopStringCriteria

#: Given each row's "has ended" flag on this rank, the replica's verdict per row.
RowVote = Callable[[torch.Tensor], torch.Tensor]


class RowEnds(StoppingCriteria):
    def __init__(
        self,
        *,
        prompt_length: int,
        end_ids: Sequence[int],
        tokenizer: PreTrainedTokenizerBase,
        stop: Sequence[str],
        vote: RowVote | None,
        budgets: Sequence[int] | None = None,
    ) -> None:
        self._prompt_length = prompt_length
        self._end_ids = sorted(set(end_ids))
        self._stop = StopStringCriteria(tokenizer, list(stop)) if stop else None
        self._vote = vote
        self._budgets = None if budgets is None else torch.tensor(list(budgets))
        self._ended: torch.Tensor | None = None
        #: Per row, how many tokens it generated when it ended (its end included); 0: it never ended.
        self.ended_at: list[int] = []

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        ends = torch.tensor(self._end_ids, device=input_ids.device)
        if self._ended is None:
            self._ended = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
            self.ended_at = [0] * input_ids.shape[0]
        generated = input_ids.shape[1] - self._prompt_length
        mine = self._ended | torch.isin(input_ids[:, -1], ends)
        if self._stop is not None:
            mine |= self._stop(input_ids, scores).to(mine.device)
        if self._budgets is not None:
            mine |= self._budgets.to(mine.device) <= generated
        verdict = self._vote(mine) if self._vote is not None else mine
        for row in torch.nonzero(verdict & ~self._ended).flatten().tolist():
            self.ended_at[row] = generated
        self._ended = verdict
        return cast(torch.BoolTensor, verdict)


def cut(rows: Sequence[Sequence[int]], ended_at: Sequence[int]) -> list[list[int]]:
    """Each row up to where it ended: the tokens after it are what the batch went on computing."""
    return [list(row[:end]) if end > 0 else list(row) for row, end in zip(rows, ended_at, strict=True)]
