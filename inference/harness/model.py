"""The lm-eval model a worker group hands to ``simple_evaluate``: lm-eval's ``HFLM`` around the model evald
loaded, on every rank of a tp × dp group.

- **tp**: every rank of a replica runs ``simple_evaluate`` with the same task, limit and seeds, so each
  builds the same requests, batches them alike and takes the same forward passes: the tensor-parallel
  all-reduces pair up. Where decoding ends is voted across the replica's tp ranks at every step (as for
  evald's own ``generate`` task, :mod:`inference.stopping`), so no rank leaves ``generate`` alone and
  hangs its peers. After each of lm-eval's request calls the tp ranks compare a digest of their responses
  (a disagreement is settled by majority and reported, as for ``generate``).
- **dp**: lm-eval's own data parallelism, told the truth: the model is rank ``replica`` of ``dp``, so lm-eval
  deals the documents to the replicas (``rank::world_size``), pads their request counts to match, and
  gathers the per-document metrics and samples to replica 0, which aggregates them, exactly as under
  ``accelerate launch``. Its collectives run over this rank's peer group (the same tp position in every
  replica), never over the whole world: each tp position of replica 0 receives its peers' results.

HFLM given a model instance assumes one process (rank 0 of 1) and never looks at accelerate or
``torch.distributed`` itself; the rank, world size and collectives below are the only ones it uses.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import TYPE_CHECKING, Any

import structlog
import torch
from lm_eval.models.huggingface import HFLM
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

from inference.spec import Disagreement

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from inference.group import WorkerGroup
    from inference.stopping import RowVote

log = structlog.get_logger("inference.harness")


class VotedEnds(StoppingCriteria):
    """lm-eval's stop sequences and the model's EOS, decided per row by the replica's tp ranks together.

    Stands in for every end rule ``generate`` would apply on its own (it is given ``eos_token_id=None``);
    its ``eos_token_id`` attribute keeps ``generate`` padding the rows that ended, as with its own EOS rule.
    """

    def __init__(self, inner: StoppingCriteriaList, eos_token_id: list[int], vote: RowVote) -> None:
        self._inner = inner
        self.eos_token_id = eos_token_id
        self._vote = vote
        self._ended: torch.Tensor | None = None

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        if self._ended is None:
            self._ended = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        mine = self._ended | self._inner(input_ids, scores).to(input_ids.device)
        if self.eos_token_id:
            mine |= torch.isin(input_ids[:, -1], torch.tensor(self.eos_token_id, device=input_ids.device))
        self._ended = self._vote(mine)
        verdict: torch.BoolTensor = self._ended  # type: ignore[assignment]
        return verdict


class ReplicaLM(HFLM):  # type: ignore[misc]
    """HFLM on ``pretrained`` (evald's loaded model) as one rank of ``group``; ``peers`` is this rank's
    peer group (:meth:`WorkerGroup.peer_group`), None with one replica."""

    def __init__(self, *, group: WorkerGroup, peers: ProcessGroup | None, **kwargs: Any) -> None:
        # HFLM re-ties the output embeddings to the input ones (tie_weights); AutoTP cut lm_head apart from
        # the embeddings, keeping only this rank's shard: put the weights evald loaded back.
        head = kwargs["pretrained"].get_output_embeddings()
        loaded = None if head is None else head.weight
        super().__init__(**kwargs)
        if head is not None and head.weight is not loaded:
            head.weight = loaded
        self._group = group
        self._peers = peers
        self._rank = group.topology.replica
        self._world_size = group.topology.dp
        #: Requests this rank served, by kind (lm-eval pads a replica's count to its peers').
        self.served: Counter[str] = Counter()
        #: With tp > 1: how many of lm-eval's request calls (one per request kind) the replica's tp ranks
        #: compared, and where they disagreed.
        self.checked = 0
        self.disagreements: list[Disagreement] = []

    def generate_until(self, requests: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        self.served["generate_until"] += len(requests)
        return self._agreed(list(super().generate_until(requests, *args, **kwargs)))

    def loglikelihood(self, requests: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        self.served["loglikelihood"] += len(requests)
        return self._agreed(list(super().loglikelihood(requests, *args, **kwargs)))

    def loglikelihood_rolling(self, requests: list[Any], *args: Any, **kwargs: Any) -> list[Any]:
        self.served["loglikelihood_rolling"] += len(requests)
        return self._agreed(list(super().loglikelihood_rolling(requests, *args, **kwargs)))

    def _agreed(self, responses: list[Any]) -> list[Any]:
        """The replica's responses to one request call: its tp ranks compare a digest of theirs, and a
        disagreement is settled by majority (the tp head on a tie) and recorded, as for ``generate`` tasks."""
        topology = self._group.topology
        if topology.tp == 1:
            return responses
        number = self.checked
        self.checked += 1
        digest = hashlib.sha256(repr(responses).encode()).hexdigest()
        return self._group.agree_tp(digest, responses, batch=number, disagreements=self.disagreements)

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every replica's ``tensor`` (lm-eval gathers its request counts and batch sizes), concatenated
        along the first dimension, as accelerate's gather."""
        if self.world_size <= 1:
            return tensor
        import torch.distributed as dist

        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, tensor.detach().cpu().reshape(-1).tolist(), group=self._peers)
        return torch.tensor([value for part in parts for value in part], device=tensor.device)

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every replica's ``obj`` on replica ``dst`` (its rank at this tp position), by replica."""
        if self.world_size <= 1:
            return [obj]
        import torch.distributed as dist

        result: list[Any] | None = [None] * self.world_size if self.rank == dst else None
        target = self._group.topology.peer_ranks(self._group.topology.tp_rank)[dst]
        dist.gather_object(obj, result, dst=target, group=self._peers)
        return result

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            dist.barrier(group=self._peers)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **kwargs: Any) -> Any:
        if self._group.topology.tp == 1:
            return super()._model_generate(context, max_length, stop, **kwargs)
        # lm-eval builds its call (sampling settings, stop sequences) as ever; only the end rule changes,
        # in the call it makes.
        model = self._model
        generate = model.generate
        configured = model.generation_config.eos_token_id
        eos = [
            i for i in (configured if isinstance(configured, list) else [configured]) if isinstance(i, int)
        ]

        def voted(*args: Any, stopping_criteria: StoppingCriteriaList, **call: Any) -> Any:
            ends = VotedEnds(stopping_criteria, eos, self._group.vote_rows)
            return generate(*args, stopping_criteria=StoppingCriteriaList([ends]), eos_token_id=None, **call)

        model.generate = voted
        try:
            return super()._model_generate(context, max_length, stop, **kwargs)
        finally:
            del model.generate
