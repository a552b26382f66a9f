"""A paged KV cache: the live sequences' keys and values in fixed-size blocks of one shared pool, so the
memory a run holds follows the tokens its live sequences hold, not slots × the longest possible sequence.

Each layer's pool is ``[blocks, block_size, kv_heads, head_dim]``; a sequence owns a list of blocks (its
block table), token ``p`` lying at offset ``p % block_size`` of its ``p // block_size``-th block. A prompt
takes the blocks it needs when it is admitted, a decoding step gives a sequence one more block only when
its last is full, and a sequence that ends returns its blocks at once. With a pool smaller than every slot
at full length (sized for the device, :func:`pool_tokens`), a long-tailed load runs many more sequences at
once than a cache of whole-length slots (:mod:`inference.engines.slots`) in the same memory; if the live
sequences outgrow the pool, the engine preempts the newest and runs it again later
(:mod:`inference.engines.continuous`).

A forward pass writes the new tokens' keys and values into their blocks, then reads each live sequence's
blocks back through its block table (a gather of whole blocks, one per layer and step) for the model's
own attention, which takes them with the same 4D mask as the slot cache. The gather is the price of not
holding whole slots: it copies what the attention reads. Moving a sequence to another slot moves its
block table, not its keys and values.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from inference.engines.slots import KVLayer, LayeredCache, prefill_mask

#: Tokens per block: small enough that a sequence wastes little of its last block, large enough that block
#: tables stay short (vLLM's default).
BLOCK_SIZE = 16


def pool_tokens(worst: int, per_token_bytes: int, device: torch.device, *, fraction: float = 0.8) -> int:
    """Tokens the pool holds: ``worst`` (every slot at full length) where that fits ``fraction`` of the
    memory free on ``device`` now (CUDA: the device's free memory; elsewhere: the host's available
    memory, a quarter of it), else as many as fit."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
    else:
        import psutil

        free = psutil.virtual_memory().available // 4
    return max(1, min(worst, int(free * fraction) // per_token_bytes))


class Pages(LayeredCache["PageLayer"]):
    """Which blocks each slot's sequence holds, and what the next forward pass writes and reads."""

    def __init__(self, slots: int, tokens: int, length: int, device: torch.device) -> None:
        self.block_size = BLOCK_SIZE
        self.blocks = math.ceil(tokens / self.block_size)
        self.slots = slots
        self.device = device
        self.free = list(range(self.blocks - 1, -1, -1))
        #: Tokens each slot's sequence holds (its next token goes at that position), and its blocks.
        self.ends = [0] * slots
        self.owned: list[list[int]] = [[] for _ in range(slots)]
        #: The block tables on the device, one row per slot (unused entries point at block 0, masked off).
        self.table = torch.zeros(slots, math.ceil(length / self.block_size), dtype=torch.long, device=device)
        self.peak = 0
        # What the next forward pass writes (flat pool positions), where those tokens lie in its input
        # (prefill: row and column), and what it reads (decode: each row's first blocks, row after row).
        self.write = torch.zeros(0, dtype=torch.long, device=device)
        self.source: tuple[torch.Tensor, torch.Tensor] | None = None
        self.read = torch.zeros(0, dtype=torch.long, device=device)
        self.rows = 0
        self.view = 0

    def new_layer(self) -> PageLayer:
        return PageLayer(self)

    def _grant(self, slot: int, tokens: int, *, spare: int = 0) -> bool:
        """Give ``slot`` blocks enough for ``tokens`` tokens, leaving ``spare`` free; False (and nothing
        taken) if the pool is short."""
        owned = self.owned[slot]
        needed = math.ceil(tokens / self.block_size) - len(owned)
        if needed + spare > len(self.free):
            return False
        if needed > 0:
            taken = [self.free.pop() for _ in range(needed)]
            self.table[slot, len(owned) : len(owned) + needed] = torch.tensor(taken, device=self.device)
            owned.extend(taken)
            self.peak = max(self.peak, self.blocks - len(self.free))
        return True

    def admit(self, slot: int, length: int) -> bool:
        """Blocks for a ``length``-token prompt and its first new token in ``slot``; False if the pool is
        short of them now. A block stays free for each sequence already live (in the slots below): one
        admitted into the last blocks would be preempted at the next step that fills a block, and admitted
        again at once."""
        return self._grant(slot, length + 1, spare=slot)

    def grow(self, live: int) -> bool:
        """Blocks for one more token of each of slots ``0 .. live-1``; False if the pool is short (the
        slots that got theirs keep them)."""
        return all(self._grant(slot, self.ends[slot] + 1) for slot in range(live))

    def release(self, slot: int) -> None:
        """The sequence in ``slot`` ended or was preempted: its blocks go back to the pool."""
        self.free.extend(reversed(self.owned[slot]))
        self.owned[slot] = []
        self.ends[slot] = 0

    def move(self, source: int, target: int) -> None:
        """The sequence in slot ``source`` goes to slot ``target`` (released): its table, not its data."""
        self.owned[target], self.owned[source] = self.owned[source], []
        self.ends[target], self.ends[source] = self.ends[source], 0
        self.table[target] = self.table[source]

    def _flat(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Pool positions of token ``positions`` of the sequences in ``slots`` (broadcast together)."""
        blocks = self.table[slots, positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size

    def for_prefill(self, first: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up a prefill of ``len(lengths)`` prompts into slots ``first ..`` (admitted), left-padded to
        the longest. Returns the 4D mask and the position ids."""
        width = max(lengths)
        rows: list[int] = []
        columns: list[int] = []
        slots: list[int] = []
        positions: list[int] = []
        for row, length in enumerate(lengths):
            self.ends[first + row] = length
            rows += [row] * length
            columns += range(width - length, width)
            slots += [first + row] * length
            positions += range(length)
        tensor = torch.tensor([rows, columns, slots, positions], dtype=torch.long, device=self.device)
        self.source = (tensor[0], tensor[1])
        self.write = self._flat(tensor[2], tensor[3])
        self.view = width
        return prefill_mask(lengths, self.device)

    def for_decode(self, live: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up one decoding step of slots ``0 .. live-1`` (grown): the 4D mask and the position ids."""
        ends = torch.tensor(self.ends[:live], dtype=torch.long, device=self.device)
        slots = torch.arange(live, device=self.device)
        self.source = None
        blocks = math.ceil((max(self.ends[:live]) + 1) / self.block_size)
        self.rows, self.view = live, blocks * self.block_size
        self.write = self._flat(slots, ends)
        self.read = self.table[:live, :blocks].reshape(-1)
        span = torch.arange(self.view, device=self.device).unsqueeze(0)
        mask = span <= ends.unsqueeze(1)
        return mask[:, None, None, :], ends.unsqueeze(1)

    def advance(self, live: int) -> None:
        for slot in range(live):
            self.ends[slot] += 1

    def peak_tokens(self) -> int:
        return self.peak * self.block_size


class PageLayer(KVLayer):  # type: ignore[no-untyped-call]
    """One decoder layer's keys and values in :class:`Pages`."""

    def __init__(self, pages: Pages) -> None:
        super().__init__(pages)
        self._pages = pages

    def shape(self, kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (self._pages.blocks, self._pages.block_size, kv_heads, head_dim)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        blocks_of_keys, blocks_of_values = self.tensors()
        pages = self._pages
        keys, values = blocks_of_keys.flatten(0, 1), blocks_of_values.flatten(0, 1)
        if pages.source is not None:
            # A prefill: the prompts attend among themselves; only their real tokens are kept.
            rows, columns = pages.source
            keys.index_copy_(0, pages.write, key_states.transpose(1, 2)[rows, columns])
            values.index_copy_(0, pages.write, value_states.transpose(1, 2)[rows, columns])
            return key_states, value_states
        keys.index_copy_(0, pages.write, key_states[:, :, 0])
        values.index_copy_(0, pages.write, value_states[:, :, 0])
        shape = (pages.rows, pages.view, *blocks_of_keys.shape[2:])
        read_keys = blocks_of_keys.index_select(0, pages.read).view(shape).transpose(1, 2)
        read_values = blocks_of_values.index_select(0, pages.read).view(shape).transpose(1, 2)
        return read_keys, read_values

    def get_max_length(self) -> int:
        return self._pages.table.shape[1] * self._pages.block_size
