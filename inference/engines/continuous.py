"""The continuous-batching engine: a sequence that ends frees its slot, and the next waiting prompt takes
it at the next step, so no step computes a finished row and a long response holds one slot, not a batch.

It drives transformers' own model forward (any causal LM whose attention takes a 4D mask and a
``Cache``) over a preallocated slot cache (:mod:`inference.engines.slots`): each step is either one
prefill of the prompts that fill the free slots, left-padded together, or one decoding step of every
live sequence. Tokens are chosen as the fixed engine chooses them (:mod:`inference.engines.draws`), and
a row ends on the same rules (:class:`~inference.stopping.RowEnds`'s end tokens, stop strings, budget).

Why not transformers' own continuous batching (``generate_batch``, ``ContinuousBatchingManager``): it
samples with one generator for the whole batch (a sample depends on its neighbours), its sampler writes
only a token and a log-probability (no per-step entropy), it ends a request only at EOS or its budget
(no stop strings), and its API moved between the releases this project meets (5.17 on the GPU image,
5.25 here). BENCHMARKS.md has what each measured.

With ``paged`` (the ``paged`` engine, :mod:`inference.engines.paged`) the cache is a pool of blocks
(:mod:`inference.engines.pages`) sized for the device: a prompt is admitted when the pool has blocks for
it, and when the live sequences outgrow the pool the newest is preempted, its blocks freed, and run again
from its prompt later (its draws depend on its item, sample and step only, so it comes out the same).

Tensor parallelism is not supported: every tp rank would have to agree on admissions and ends at every
step, and DeepSpeed AutoTP's layers are not tested with this cache. ``tp > 1`` uses the fixed engine.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from inference.engines.slots import LayeredCache

from inference.engines.base import (
    Decoding,
    Engine,
    EngineRun,
    Generation,
    Request,
    Row,
    generations_of,
    stop_token_ids,
)
from inference.engines.draws import choose, sample_seed


@dataclass
class _Sequence:
    """One sample of one request, while it waits or runs."""

    request: int
    prompt: tuple[int, ...]
    budget: int
    seed: int
    tokens: list[int] = field(default_factory=list)
    entropy: float = 0.0
    done: bool = False


class ContinuousEngine(Engine):
    name = "continuous"
    #: Attend with :func:`~inference.engines.slots.grouped_attention` (default: on CUDA devices; the
    #: model's own attention elsewhere, where it reads the cache once already).
    grouped: bool | None = None
    #: Keep keys and values in a pool of blocks (:class:`~inference.engines.pages.Pages`) rather than
    #: whole-length slots.
    paged: bool = False
    #: The paged pool's size in tokens; None: sized for the device (:func:`~inference.engines.pages.
    #: pool_tokens`).
    kv_tokens: int | None = None
    #: After a run: the most tokens the cache held at once (blocks in use × block size, or slots × length),
    #: and how many times a sequence was preempted.
    peak_tokens: int = 0
    preemptions: int = 0

    def _cache(
        self, slots: int, length: int, per_token_bytes: int, device: torch.device
    ) -> LayeredCache[Any]:
        """The cache for ``slots`` sequences of up to ``length`` tokens."""
        if not self.paged:
            from inference.engines.slots import Slots

            return Slots(slots, length, device)
        from inference.engines.pages import Pages, pool_tokens

        worst = slots * length
        tokens = self.kv_tokens or pool_tokens(worst, per_token_bytes, device)
        return Pages(slots, min(tokens, worst), length, device)

    def run(self, requests: Sequence[Request], decoding: Decoding) -> EngineRun:
        sequences = [
            _Sequence(
                request=position,
                prompt=request.prompt_ids,
                budget=request.budget(decoding),
                seed=sample_seed(decoding.seed, request.key, sample),
            )
            for position, request in enumerate(requests)
            for sample in range(decoding.n_samples)
        ]
        if not sequences:
            return EngineRun({}, [])
        slots = min(self.batch_size, len(sequences))
        if decoding.simulate_oom_above is not None and slots > decoding.simulate_oom_above:
            raise torch.OutOfMemoryError(
                f"simulated: {slots} concurrent sequences need more memory than the cap of "
                f"{decoding.simulate_oom_above} allows"
            )
        device = next(iter(self.model.parameters())).device
        grouped = self.grouped if self.grouped is not None else device.type == "cuda"
        with torch.inference_mode(), _attention(self.model, grouped):
            loop = _Loop(self.model, self.tokenizer, decoding, slots, sequences, self._cache)
            latencies = loop.run()
        self.peak_tokens, self.preemptions = loop.slots.peak_tokens(), loop.preemptions
        stop_ids = stop_token_ids(self.model, self.tokenizer)
        generations = generations_of(
            [Row(tuple(s.tokens), s.entropy, len(s.tokens)) for s in sequences],
            [s.budget for s in sequences],
            self.tokenizer,
            stop_ids,
            decoding,
        )
        by_request: dict[int, list[Generation]] = {}
        for sequence, generation in zip(sequences, generations, strict=True):
            by_request.setdefault(requests[sequence.request].index, []).append(generation)
        return EngineRun(by_request, latencies)


@contextlib.contextmanager
def _attention(model: Any, grouped: bool) -> Iterator[None]:
    """The model attends with :func:`~inference.engines.slots.grouped_attention` inside the block."""
    if not grouped:
        yield
        return
    from transformers import AttentionInterface

    from inference.engines.slots import GROUPED_ATTENTION, grouped_attention

    AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
    config = model.config.get_text_config()
    before = config._attn_implementation
    config._attn_implementation = GROUPED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


class _Loop:
    """One run's scheduling: admit waiting sequences into free slots, step the live ones, retire ends."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        decoding: Decoding,
        slots: int,
        sequences: list[_Sequence],
        cache: Callable[[int, int, int, torch.device], LayeredCache[Any]],
    ) -> None:
        from transformers.generation.stopping_criteria import StopStringCriteria

        self.model = model
        self.decoding = decoding
        self.device = next(iter(model.parameters())).device
        self.pad = tokenizer.pad_token_id
        self.end_ids = {*stop_token_ids(model, tokenizer), tokenizer.pad_token_id}
        self.stop = StopStringCriteria(tokenizer, list(decoding.stop)) if decoding.stop else None
        self.waiting = deque(sequences)
        self.live: list[_Sequence] = []
        self.capacity = slots
        self.preemptions = 0
        length = max(len(s.prompt) for s in sequences) + max(s.budget for s in sequences) + 1
        config = model.config.get_text_config()
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        dtype = next(iter(model.parameters())).dtype
        per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize
        self.slots = cache(slots, length, per_token, self.device)
        self.cache = self.slots.cache(config.num_hidden_layers)
        self.slots.allocate(kv_heads, head_dim, dtype)
        # transformers 5.x renamed the forward's cache argument; older releases know only the first name.
        parameters = inspect.signature(model.forward).parameters
        self.cache_argument = "cache" if "cache" in parameters else "past_key_values"

    def run(self) -> list[float]:
        """Generate every sequence; returns the seconds in which each ``capacity`` of them ended."""
        latencies: list[float] = []
        started = time.perf_counter()
        ended = 0
        while self.waiting or self.live:
            if not (self.waiting and len(self.live) < self.capacity and self._admit()):
                self._decode()
            ended += self._retire()
            if ended >= self.capacity:
                now = time.perf_counter()
                latencies.append(now - started)
                started, ended = now, ended - self.capacity
        if ended or not latencies:
            latencies.append(time.perf_counter() - started)
        return latencies

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        output = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_argument: self.cache},
        )
        logits: torch.Tensor = output.logits[:, -1, :]
        return logits

    def _admit(self) -> bool:
        """Prefill the waiting prompts that fit the free slots (and the pool); False if none fit."""
        count = min(self.capacity - len(self.live), len(self.waiting))
        admitted: list[_Sequence] = []
        while len(admitted) < count and self.slots.admit(
            len(self.live) + len(admitted), len(self.waiting[0].prompt)
        ):
            admitted.append(self.waiting.popleft())
        if not admitted:
            if not self.live:
                raise torch.OutOfMemoryError(
                    f"the KV cache's pool cannot hold one prompt of {len(self.waiting[0].prompt)} tokens "
                    "and its first new token"
                )
            return False
        lengths = [len(s.prompt) for s in admitted]
        mask, positions = self.slots.for_prefill(len(self.live), lengths)
        width = max(lengths)
        ids = torch.tensor(
            [[self.pad] * (width - len(s.prompt)) + list(s.prompt) for s in admitted], device=self.device
        )
        logits = self._forward(ids, mask, positions)
        self.live.extend(admitted)
        self._choose(admitted, logits)
        return True

    def _decode(self) -> None:
        while not self.slots.grow(len(self.live)):
            self._preempt()
        live = len(self.live)
        mask, positions = self.slots.for_decode(live)
        ids = torch.tensor([[s.tokens[-1]] for s in self.live], device=self.device)
        logits = self._forward(ids, mask, positions)
        self.slots.advance(live)
        self._choose(self.live, logits)

    def _choose(self, rows: list[_Sequence], logits: torch.Tensor) -> None:
        """Each row's next token, its entropy, and whether the row has ended."""
        from inference.entropy import token_entropy

        decoding = self.decoding
        if decoding.entropy:
            for row, value in zip(
                rows, token_entropy(logits, decoding.temperature or 1.0).tolist(), strict=True
            ):
                row.entropy += value
        seeds = torch.tensor([s.seed for s in rows], dtype=torch.int64)
        steps = torch.tensor([len(s.tokens) for s in rows], dtype=torch.int64)
        tokens = choose(logits, decoding.temperature, decoding.top_p, seeds, steps).tolist()
        for row, token in zip(rows, tokens, strict=True):
            row.tokens.append(token)
            row.done = token in self.end_ids or len(row.tokens) >= row.budget
        if self.stop is not None:
            window = self.stop.maximum_token_len
            tails = [(list(s.prompt[-window:]) + s.tokens[-window:])[-window:] for s in rows]
            tails = [[self.pad] * (window - len(t)) + t for t in tails]
            matched = self.stop(torch.tensor(tails), None).tolist()
            for row, hit in zip(rows, matched, strict=True):
                row.done = row.done or bool(hit)

    def _preempt(self) -> None:
        """The pool is short of a block: the newest live sequence gives its blocks back and waits first in
        line, to start again from its prompt."""
        if len(self.live) == 1:
            raise torch.OutOfMemoryError(
                f"the KV cache's pool cannot hold one sequence of {len(self.live[0].prompt)} prompt tokens "
                f"and {len(self.live[0].tokens)} new ones"
            )
        sequence = self.live.pop()
        self.slots.release(len(self.live))
        sequence.tokens, sequence.entropy, sequence.done = [], 0.0, False
        self.waiting.appendleft(sequence)
        self.preemptions += 1

    def _retire(self) -> int:
        """Free the slots of the sequences that ended: the last live sequence moves into each."""
        ended = [slot for slot, s in enumerate(self.live) if s.done]
        for slot in reversed(ended):
            last = len(self.live) - 1
            self.slots.release(slot)
            if slot != last:
                self.slots.move(last, slot)
                self.live[slot] = self.live[last]
            self.live.pop()
        return len(ended)
