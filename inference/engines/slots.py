"""A preallocated KV cache of fixed slots, one sequence per slot, for transformers' own model forward.

Each layer holds keys and values of shape ``[slots, kv_heads, length, head_dim]``, allocated once (so a
device too small for the load fails at the start, not an hour in). A sequence occupies the columns
``[start, end)`` of its slot and writes its next token at ``end``; live sequences fill slots
``0 .. live-1``, so a forward pass reads the cache as a view, never a copy, up to the longest live
sequence. When a sequence ends, the last live one moves into its slot (one row copied), and a new
sequence's prompt is written into the next free slot.

It plugs into a transformers model as its ``Cache`` (one :class:`SlotLayer` per decoder layer); the
caller passes the 4D attention mask (:meth:`Slots.for_decode`, :meth:`Slots.for_prefill`), which the
model uses as is. On a GPU the attention over it is :func:`grouped_attention`: transformers' SDPA path
copies every key-value head once per query head it serves whenever a mask is given (``repeat_kv``),
which for a grouped-query model (TinyLlama: 32 query heads on 4 key-value heads) moves 8 times the
cache through memory at every step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

#: The name :func:`grouped_attention` is registered under in transformers' attention interface.
GROUPED_ATTENTION = "evald_grouped"


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` ``[B, H, Q, D]`` over a grouped key-value cache ``[B, Hkv, L, D]`` with a
    boolean mask ``[B, 1, Q, L]``, each key-value head read once for the query heads it serves (transformers'
    head order: query head ``h`` uses key-value head ``h // (H / Hkv)``). Returns ``[B, Q, H, D]``."""
    batch, heads, queries, dim = query.shape
    groups = heads // key.shape[1]
    scale = scaling if scaling is not None else dim**-0.5
    grouped = query.reshape(batch, key.shape[1], groups * queries, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale
    if attention_mask is not None:
        mask = attention_mask[:, :, None].expand(batch, 1, groups, queries, attention_mask.shape[-1])
        scores = scores.masked_fill(~mask.reshape(batch, 1, groups * queries, -1), float("-inf"))
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    output = torch.matmul(weights, value).reshape(batch, heads, queries, dim)
    return output.transpose(1, 2).contiguous(), None


Layer = TypeVar("Layer", bound="KVLayer")


def prefill_mask(lengths: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The 4D attention mask and the position ids of prompts of ``lengths`` tokens, left-padded together
    (each prompt's last token in the last column)."""
    width = max(lengths)
    own = torch.tensor(lengths, dtype=torch.long, device=device)
    columns = torch.arange(width, device=device)
    start = (width - own).unsqueeze(1)
    positions = (columns.unsqueeze(0) - start).clamp(min=0)
    # Row r's query at column i sees the columns j of its own prompt with j <= i.
    causal = columns.unsqueeze(0) <= columns.unsqueeze(1)
    mask = causal.unsqueeze(0) & (columns.unsqueeze(0) >= start).unsqueeze(1)
    # A padding query sees its own column only: a row of all -inf would turn into NaN.
    mask |= torch.eye(width, dtype=torch.bool, device=device).unsqueeze(0)
    return mask.unsqueeze(1), positions


class LayeredCache(ABC, Generic[Layer]):
    """A cache of one layer object per decoder layer (:meth:`new_layer`), built and allocated together;
    the layers read :attr:`view`, the columns the next forward pass attends over."""

    view: int
    device: torch.device
    layers: list[Layer]

    @abstractmethod
    def new_layer(self) -> Layer: ...

    def cache(self, layers: int) -> Cache:
        self.layers = [self.new_layer() for _ in range(layers)]
        return Cache(layers=self.layers)  # type: ignore[arg-type]

    def allocate(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Allocate every layer's keys and values now (a too-small device fails here)."""
        for layer in self.layers:
            layer.allocate(kv_heads, head_dim, dtype)

    # What the continuous engine's loop asks of a cache (slots are numbered 0 .. live-1).

    @abstractmethod
    def admit(self, slot: int, length: int) -> bool:
        """Room in ``slot`` for a ``length``-token prompt and its first new token; False if none now."""

    @abstractmethod
    def grow(self, live: int) -> bool:
        """Room for one more token of each of slots ``0 .. live-1``; False if the cache is short."""

    @abstractmethod
    def release(self, slot: int) -> None:
        """The sequence in ``slot`` ended or was preempted."""

    @abstractmethod
    def move(self, source: int, target: int) -> None:
        """The sequence in slot ``source`` goes to slot ``target`` (released)."""

    @abstractmethod
    def for_prefill(self, first: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up a prefill of prompts of ``lengths`` into slots ``first ..``: the 4D mask, position ids."""

    @abstractmethod
    def for_decode(self, live: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up one decoding step of slots ``0 .. live-1``: the 4D mask and the position ids."""

    @abstractmethod
    def advance(self, live: int) -> None:
        """Slots ``0 .. live-1`` each hold one more token (after a decoding step)."""

    @abstractmethod
    def peak_tokens(self) -> int:
        """The most tokens this cache held room for at once."""


class KVLayer(CacheLayerMixin):  # type: ignore[no-untyped-call]
    """One decoder layer's keys and values in a :class:`LayeredCache`."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: LayeredCache[Any]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._owner = owner

    @abstractmethod
    def shape(self, kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """The shape of this layer's keys (and of its values)."""

    def allocate(self, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        shape = self.shape(kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=self._owner.device)
        self.values = torch.zeros(shape, dtype=dtype, device=self._owner.device)
        self.device = self._owner.device
        self.is_initialized = True

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None or self.values is None:
            raise RuntimeError(f"{type(self).__name__} used before its cache's allocate")
        return self.keys, self.values

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states.shape[1], key_states.shape[-1], key_states.dtype)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._owner.view, 0

    def get_seq_length(self) -> int:
        return self._owner.view


class Slots(LayeredCache["SlotLayer"]):
    """Where each slot's sequence lies, and what the next forward pass reads and writes."""

    def __init__(self, slots: int, length: int, device: torch.device) -> None:
        self.slots = slots
        self.length = length
        self.device = device
        #: First valid column of each slot, and the column its next token goes to.
        self.start = torch.zeros(slots, dtype=torch.long, device=device)
        self.end = torch.zeros(slots, dtype=torch.long, device=device)
        #: The rows the next forward pass covers (``first .. first + rows - 1``), and the columns it reads.
        self.first = 0
        self.rows = 0
        self.view = 0
        self.prefill_width = 0

    def new_layer(self) -> SlotLayer:
        return SlotLayer(self)

    def for_prefill(self, first: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up a prefill of ``len(lengths)`` prompts into slots ``first ..``; left-padded to the longest,
        so every prompt's last token is the last column. Returns the 4D mask and the position ids."""
        width = max(lengths)
        rows = len(lengths)
        own = torch.tensor(lengths, dtype=torch.long, device=self.device)
        self.first, self.rows, self.view, self.prefill_width = first, rows, width, width
        self.start[first : first + rows] = width - own
        self.end[first : first + rows] = width
        return prefill_mask(lengths, self.device)

    def for_decode(self, live: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Set up one decoding step of slots ``0 .. live-1``: the 4D mask and the position ids."""
        start, end = self.start[:live], self.end[:live]
        self.first, self.rows, self.prefill_width = 0, live, 0
        self.view = int(end.max()) + 1
        columns = torch.arange(self.view, device=self.device).unsqueeze(0)
        mask = (columns >= start.unsqueeze(1)) & (columns <= end.unsqueeze(1))
        return mask[:, None, None, :], (end - start).unsqueeze(1)

    def admit(self, slot: int, length: int) -> bool:
        """A slot holds any prompt: its columns were allocated whole."""
        return True

    def grow(self, live: int) -> bool:
        return True

    def release(self, slot: int) -> None:
        """Nothing to give back: the slot keeps its columns for the next sequence."""

    def advance(self, live: int) -> None:
        self.end[:live] += 1

    def peak_tokens(self) -> int:
        return self.slots * self.length

    def move(self, source: int, target: int) -> None:
        """The sequence in slot ``source`` goes to slot ``target`` (whose sequence has ended)."""
        used = int(self.end[source])
        for layer in self.layers:
            layer.move(source, target, used)
        self.start[target] = self.start[source]
        self.end[target] = self.end[source]


class SlotLayer(KVLayer):  # type: ignore[no-untyped-call]
    """One decoder layer's keys and values in :class:`Slots`."""

    def __init__(self, slots: Slots) -> None:
        super().__init__(slots)
        self._slots = slots

    def shape(self, kv_heads: int, head_dim: int) -> tuple[int, ...]:
        return (self._slots.slots, kv_heads, self._slots.length, head_dim)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.tensors()
        slots = self._slots
        rows = slice(slots.first, slots.first + slots.rows)
        if slots.prefill_width:
            keys[rows, :, : slots.prefill_width] = key_states
            values[rows, :, : slots.prefill_width] = value_states
        else:
            index = torch.arange(slots.rows, device=slots.device)
            at = slots.end[: slots.rows]
            keys[index, :, at] = key_states[:, :, 0]
            values[index, :, at] = value_states[:, :, 0]
        return keys[rows, :, : slots.view], values[rows, :, : slots.view]

    def move(self, source: int, target: int, used: int) -> None:
        keys, values = self.tensors()
        keys[target, :, :used] = keys[source, :, :used]
        values[target, :, :used] = values[source, :, :used]

    def get_max_length(self) -> int:
        return self._slots.length
