"""A replica's part of an evaluation: its share of the items (dealt and tokenised by its tp head), what it
generates or scores on them, and the votes that keep its tp ranks in step.

:mod:`inference.task` loads the model, hands each replica its part through :class:`Replica`, and gathers
the :class:`ReplicaOutput` of every replica head on rank 0 to grade.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from inference.code.stream import JudgingStream, generate_judging
from inference.consistency import token_digest
from inference.engines import build_engine, requests_of, resolve
from inference.generation import (
    Batch,
    Decoding,
    Encoding,
    Generation,
    prepare_batches,
    run_batches,
    token_lengths,
)
from inference.likelihood import score_batches
from inference.spec import Disagreement
from inference.topology import deal_by_length

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from inference.faults import Faults
    from inference.group import WorkerGroup
    from inference.loader import LoadedModel
    from inference.metrics import DocumentRecord, Metric
    from inference.spec import JobSpec

log = structlog.get_logger("inference.replica")


@dataclass(frozen=True)
class ReplicaShare:
    #: Positions in the eval set of this replica's items; batch indices point into this list.
    items: list[int]
    batches: list[Batch]


@dataclass(frozen=True)
class ReplicaOutput:
    """What a replica head sends to rank 0: its items' results by their position in the eval set."""

    generations: list[tuple[int, list[Generation]]] = field(default_factory=list)
    documents: list[tuple[int, DocumentRecord]] = field(default_factory=list)
    #: Seconds each of its batches took.
    latencies: tuple[float, ...] = ()
    checked: int = 0
    disagreements: tuple[Disagreement, ...] = ()
    peak_memory_mb: float = 0.0


#: What an engine gives back: each prompt's generations by its index in the share, and the batch latencies.
Generated = tuple[dict[int, list[Generation]], list[float]]


@dataclass(frozen=True)
class Replica:
    """This rank's part in its replica of ``group``, for ``spec``; ``faults`` are the ones a test injects."""

    spec: JobSpec
    group: WorkerGroup
    faults: Faults

    def share(
        self, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], encoding: Encoding
    ) -> ReplicaShare:
        """This replica's items and batches: dealt and tokenised by its tp head, then sent to its tp ranks
        so that every rank of the replica computes on exactly the same tensors."""
        topology = self.group.topology
        share = None
        if topology.is_head:
            mine = deal_by_length(token_lengths(tokenizer, prompts, encoding), topology.dp)[topology.replica]
            batches = prepare_batches(
                tokenizer, [prompts[i] for i in mine], self.spec.task.batch_size, encoding
            )
            share = ReplicaShare(mine, batches)
        shared: ReplicaShare = self.group.share_from_head(share)
        return shared

    def score(self, loaded: LoadedModel, share: ReplicaShare) -> ReplicaOutput:
        """A likelihood task's documents, scored."""
        scored, latencies = score_batches(loaded.model, share.batches)
        return ReplicaOutput(
            documents=[(share.items[local], document) for local, document in scored.items()],
            latencies=tuple(latencies),
        )

    def generate(
        self, loaded: LoadedModel, share: ReplicaShare, metrics: Sequence[Metric], code: JudgingStream | None
    ) -> ReplicaOutput:
        """This replica's generations, by the engine ``[inference] batching`` resolves to (code tasks, judged
        batch by batch as they generate, by the fixed engine)."""
        vote = TpVote(self.group, self.faults)
        engine = "fixed" if code is not None else self._engine()
        generated, latencies = self._run(engine, loaded, share, self.decoding(metrics), (vote, code))
        log.info(
            "task.generated",
            engine=engine,
            batching=self.spec.inference.batching,
            rank=self.group.topology.rank,
        )
        return ReplicaOutput(
            generations=[(share.items[local], generations) for local, generations in generated.items()],
            latencies=tuple(latencies),
            checked=vote.checked,
            disagreements=tuple(vote.disagreements),
        )

    def decoding(self, metrics: Sequence[Metric]) -> Decoding:
        task = self.spec.task
        return Decoding(
            max_new_tokens=task.max_new_tokens,
            n_samples=task.n_samples,
            temperature=task.temperature,
            top_p=task.top_p,
            stop=task.stop,
            seed=self.spec.seed,
            entropy=any(metric.name == "entropy" for metric in metrics),
            simulate_oom_above=self.faults.oom_above_batch,
        )

    def _engine(self) -> str:
        inference = self.spec.inference
        return resolve(inference.batching, device=inference.device, tp=self.group.topology.tp)

    def _run(
        self,
        engine: str,
        loaded: LoadedModel,
        share: ReplicaShare,
        decoding: Decoding,
        voting: tuple[TpVote, JudgingStream | None],
    ) -> Generated:
        """``share`` generated by ``engine``; ``voting`` is the tp vote and, for a code task on rank 0, the
        judging that takes each batch's samples as soon as they are generated."""
        vote, code = voting
        agree, agree_ends = (vote, vote.ends) if self.group.topology.tp > 1 else (None, None)
        model, tokenizer = loaded.model, loaded.tokenizer
        if code is not None:
            # Rank 0's own batches are judged while it generates the next (inference.code.stream).
            return generate_judging(
                model,
                tokenizer,
                share.batches,
                decoding,
                code,
                item_keys=share.items,
                agree=agree,
                agree_ends=agree_ends,
            )
        if engine == "fixed":
            return run_batches(
                model,
                tokenizer,
                share.batches,
                decoding,
                item_keys=share.items,
                agree=agree,
                agree_ends=agree_ends,
            )
        built = build_engine(engine, model, tokenizer, batch_size=self.spec.task.batch_size)
        run = built.run(requests_of(share.batches, share.items), decoding)
        return run.generations, run.latencies


class TpVote:
    """The tp ranks' two votes: at every decoding step on which rows have ended (so that all ranks
    leave ``generate`` together), and after every batch on a digest of their token ids (the
    majority's tokens are kept, the tp head's on a tie)."""

    def __init__(self, group: WorkerGroup, faults: Faults) -> None:
        self._group = group
        self._faults = faults
        self.checked = 0
        self.disagreements: list[Disagreement] = []

    def ends(self, number: int, flags: torch.Tensor) -> torch.Tensor:
        if self._faults.divergent_tp_rank == self._group.topology.tp_rank and number == 0:
            # This rank sees every row ended at once: alone, it would leave the loop and hang its peers.
            flags = flags | True
        return self._group.vote_rows(flags)

    def __call__(self, number: int, rows: list[list[int]]) -> list[list[int]]:
        topology = self._group.topology
        if self._faults.divergent_tp_rank == topology.tp_rank and number == 0:
            rows = [[token + 1 for token in row] for row in rows]
        self.checked += 1
        return self._group.agree_tp(token_digest(rows), rows, batch=number, disagreements=self.disagreements)
