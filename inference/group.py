"""The worker group a rank belongs to: torch.distributed set up for ``dp`` replicas of ``tp`` ranks.

Started by ``torchrun`` (one node) or the ``deepspeed`` launcher (several), which set ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous; a worker started alone is a group of one, and every
collective below is then a no-op. Object collectives are used throughout: what crosses ranks is small
(prepared batches, token ids, per-sample results), and they work on gloo and NCCL alike.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from inference import shm_op
from inference.consistency import settle
from inference.errors import TaskInvalid
from inference.spec import Disagreement, InferenceSpec
from inference.topology import Topology, use_shm_all_reduce

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

log = structlog.get_logger("inference.group")

T = TypeVar("T")


def launched_rank() -> int | None:
    """This process's rank when a launcher started it, else None."""
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


#: Where DeepSpeed's CPU shared-memory all-reduce keeps each rank's buffer (its csrc/cpu/comm/shm.cpp).
SHM_FOLDER = Path("/dev/shm")


def shm_buffer_name(rank: int) -> str:
    """The name of ``rank``'s all-reduce buffer in a group whose rendezvous is this process's."""
    addr = os.environ.get("MASTER_ADDR", "")
    port = os.environ.get("MASTER_PORT", "")
    return f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"


def _unlink_shm_buffer(rank: int) -> None:
    """Remove this rank's all-reduce buffer from /dev/shm once every peer has mapped it.

    DeepSpeed never unlinks the buffers (66 MB a rank): every CPU group left its own behind until
    /dev/shm filled, and a later group that drew the same rendezvous port mapped a stale one. The
    mappings stay valid after the unlink and the memory goes when the last rank exits.
    """
    import torch.distributed as dist

    # Each rank opens its peers' buffers inside init_distributed: after this barrier all are open.
    dist.barrier()
    path = SHM_FOLDER / shm_buffer_name(rank)
    path.unlink(missing_ok=True)
    log.info("group.shm_released", path=str(path))


@dataclass
class WorkerGroup:
    topology: Topology
    local_rank: int
    #: This replica's tp ranks; None in a group of one.
    tp_group: ProcessGroup | None
    distributed: bool

    @classmethod
    def start(cls, spec: InferenceSpec) -> WorkerGroup:
        """Join the launcher's process group (or stand alone), and make one tp group per replica."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != spec.world_size:
            raise TaskInvalid(
                f"the launcher started {world} ranks but tp={spec.tp} × dp={spec.dp} needs {spec.world_size}"
            )
        topology = Topology(tp=spec.tp, dp=spec.dp, rank=launched_rank() or 0)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if world == 1:
            return cls(topology, local_rank, tp_group=None, distributed=False)

        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", str(world))))
        import torch.distributed as dist

        if spec.device.startswith("cuda"):
            import torch

            torch.cuda.set_device(local_rank)
        if spec.engine == "deepspeed":
            import deepspeed

            # DeepSpeed's CPU shared-memory all-reduce reads buffers no peer wrote unless LOCAL_SIZE is the
            # node's rank count (torchrun sets LOCAL_WORLD_SIZE only), and it reduces over the whole node
            # whatever the group: off with several replicas or nodes.
            os.environ.setdefault("LOCAL_SIZE", str(local_world))
            if not use_shm_all_reduce(dp=spec.dp, world_size=world, local_world_size=local_world):
                deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
            elif not spec.device.startswith("cuda"):
                # Loaded here, under a lock a killed rank cannot leave behind; init_distributed then takes
                # it from DeepSpeed's cache of loaded ops.
                shm_op.load()
            deepspeed.init_distributed(dist_backend=backend(spec.device))
            from deepspeed.comm import comm as ds_comm

            # Every rank computes the same answer: the op was built (or not) alike on the node, and it
            # only maps buffers when the whole world is local.
            if getattr(ds_comm.cdb, "shm_comm_op", None) is not None and world == local_world:
                _unlink_shm_buffer(topology.rank)
        else:
            dist.init_process_group(backend=backend(spec.device))
        # Every rank creates every group, in the same order: new_group is collective.
        groups = [dist.new_group(topology.replica_ranks(r)) for r in range(topology.dp)]
        return cls(topology, local_rank, tp_group=groups[topology.replica], distributed=True)

    @property
    def device(self) -> str | None:
        """The device this rank computes on, for a spec device of ``cuda``: its local GPU."""
        return f"cuda:{self.local_rank}" if self.distributed else None

    def share_from_head(self, value: Any) -> Any:
        """The tp head's ``value`` on every rank of its replica."""
        if self.topology.tp == 1:
            return value
        return self.share_from(self.topology.head_of(self.topology.replica), value)

    def share_from(self, rank: int, value: Any) -> Any:
        """``value`` of global ``rank`` (in this replica) on every rank of the replica."""
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=rank, group=self.tp_group)
        return box[0]

    def gather_tp(self, value: Any) -> list[Any]:
        """Every tp rank's ``value``, by tp rank."""
        if self.topology.tp == 1:
            return [value]
        import torch.distributed as dist

        values: list[Any] = [None] * self.topology.tp
        dist.all_gather_object(values, value, group=self.tp_group)
        return values

    def agree_tp(self, digest: str, value: T, *, batch: int, disagreements: list[Disagreement]) -> T:
        """``value`` as the majority of this replica's tp ranks has it, compared by each rank's ``digest``
        (the tp head's on a tie); a disagreement is appended to ``disagreements`` and logged by the head.
        Collective over the replica."""
        topology = self.topology
        verdict = settle(self.gather_tp(digest))
        if verdict.agreed:
            return value
        disagreements.append(
            Disagreement(replica=topology.replica, batch=batch, outvoted=verdict.outvoted, tie=verdict.tie)
        )
        if topology.is_head:
            log.warning(
                "tp.disagreement",
                replica=topology.replica,
                batch=batch,
                outvoted=list(verdict.outvoted),
                tie=verdict.tie,
            )
        kept: T = self.share_from(topology.head_of(topology.replica) + verdict.winner, value)
        return kept

    def vote_rows(self, flags: torch.Tensor) -> torch.Tensor:
        """Per row, what the majority of this replica's tp ranks flagged (the tp head's flag on a tie)."""
        if self.topology.tp == 1:
            return flags
        import torch
        import torch.distributed as dist

        mine = flags.to(torch.uint8)
        every = [torch.empty_like(mine) for _ in range(self.topology.tp)]
        dist.all_gather(every, mine, group=self.tp_group)
        stacked = torch.stack(every).to(torch.int32)
        votes = stacked.sum(dim=0) * 2
        return torch.where(votes == self.topology.tp, stacked[0] > 0, votes > self.topology.tp)

    def peer_group(self) -> ProcessGroup | None:
        """The group of this rank and its peers, the ranks at its tp position in the other replicas (for
        collectives across replicas); None with one replica. Collective: every rank must call it."""
        if self.topology.dp == 1:
            return None
        import torch.distributed as dist

        # new_group is collective: every rank creates every group, in the same order.
        groups = [dist.new_group(self.topology.peer_ranks(t)) for t in range(self.topology.tp)]
        mine: ProcessGroup = groups[self.topology.tp_rank]
        return mine

    def gather_to_root(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` on rank 0 (by rank); None elsewhere."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist

        values: list[Any] | None = [None] * self.topology.world_size if self.topology.rank == 0 else None
        dist.gather_object(value, values, dst=0)
        return values

    def close(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


def backend(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def head_results(parts: Sequence[Any], topology: Topology) -> list[Any]:
    """The values the replica heads sent (the other tp ranks send nothing)."""
    return [parts[topology.head_of(r)] for r in range(topology.dp)]
