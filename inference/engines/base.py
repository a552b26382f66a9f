"""The engine contract: what a generation engine takes and what it gives back.

In: tokenised prompts (:class:`Request`, each with the item it belongs to, which seeds its samples, and
optionally a smaller token budget of its own) and the decoding settings
(:class:`Decoding`: budget, samples, temperature, top-p, stop strings, seed,
entropy). Out, per request, ``n_samples`` :class:`Generation` (text cut at its end,
tokens before EOS, truncation, summed entropy), and the seconds the work took, in slices that add up to
the whole.

Every engine must give the same answers: greedy rows token-equal, a sampled row's tokens fixed by its
item and sample index (:mod:`inference.engines.draws`) whatever batch it lands in, a row ending at EOS,
at a stop string or at its budget alike. ``tests/test_engines.py`` holds the contract's tests, run over
every engine in :data:`inference.engines.ENGINES`: adding an engine is one file here plus its name there.

An engine that runs out of device memory raises torch's ``OutOfMemoryError`` (``Decoding.
simulate_oom_above`` fakes it above that many concurrent sequences), and the worker's retry at half the
load follows as before.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: How a response ended: an end token (EOS, or padding), a stop string, or its token budget.
End = Literal["eos", "stop", "length"]

#: Given a batch's number and every row's generated token ids, return the rows to keep (the tp ranks'
#: consistency vote hooks in here).
Agreement = Callable[[int, list[list[int]]], list[list[int]]]
#: Given a batch's number and each row's "has ended" flag on this rank, the replica's verdict per row.
EndAgreement = Callable[[int, "torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int
    n_samples: int = 1
    #: 0 decodes greedily.
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int = 0
    #: Measure the policy's entropy at every step (costs a softmax over the vocabulary per step).
    entropy: bool = False
    #: For tests of the out-of-memory path: a batch of more sequences than this raises torch's own
    #: ``OutOfMemoryError``, as a device too small for it would.
    simulate_oom_above: int | None = None


@dataclass(frozen=True)
class Generation:
    #: The response, special tokens stripped, cut before any stop string.
    text: str
    #: Generated tokens before EOS (padding and EOS not counted).
    tokens: int
    #: ``max_new_tokens`` ran out before an EOS or a stop string.
    truncated: bool
    #: With ``Decoding.entropy``: the summed per-step entropy (nats) and the steps it covers (the tokens
    #: and the step that ended the row).
    entropy_sum: float = 0.0
    entropy_tokens: int = 0
    #: How it ended: an end token, a stop string, or its token budget.
    end: End = "eos"


@dataclass(frozen=True)
class Request:
    #: Where its results go in :attr:`EngineRun.generations`.
    index: int
    prompt_ids: tuple[int, ...]
    #: The item's position in the whole eval set: with the job's seed and the sample's index, it seeds
    #: each sample's draws.
    key: int
    #: A budget below ``Decoding.max_new_tokens`` for this prompt alone; ``None``: the decoding's.
    max_new_tokens: int | None = None

    def budget(self, decoding: Decoding) -> int:
        own = self.max_new_tokens
        return decoding.max_new_tokens if own is None else min(own, decoding.max_new_tokens)


@dataclass(frozen=True)
class Row:
    """One sample's generated token ids, cut after the token that ended it (that token included), and the
    entropy of the steps that drew them."""

    tokens: tuple[int, ...]
    entropy_sum: float = 0.0
    entropy_steps: int = 0


@dataclass(frozen=True)
class EngineRun:
    #: ``n_samples`` generations per request, by :attr:`Request.index`.
    generations: dict[int, list[Generation]]
    #: Seconds, in slices that add up to the time generation took (a fixed batch each; for continuous
    #: batching, the time in which one batch size's worth of sequences ended).
    latencies: list[float]


class Engine(ABC):
    """A way of running a model over requests; ``batch_size`` is how many sequences it holds at once."""

    name: ClassVar[str]

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, batch_size: int
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @abstractmethod
    def run(self, requests: Sequence[Request], decoding: Decoding) -> EngineRun: ...


def generations_of(
    rows: Sequence[Row],
    budgets: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: Sequence[int],
    decoding: Decoding,
) -> list[Generation]:
    """Each row as the :class:`Generation` the rest of evald reads."""
    generations = finish([row.tokens for row in rows], tokenizer, stop_ids, decoding, budgets=budgets)
    if not decoding.entropy:
        return generations
    return [
        dataclasses.replace(g, entropy_sum=row.entropy_sum, entropy_tokens=row.entropy_steps)
        for g, row in zip(generations, rows, strict=True)
    ]


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    configured: Any = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    return sorted(i for i in ids if isinstance(i, int))


def finish(
    rows: Sequence[Sequence[int]],
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: Sequence[int],
    decoding: Decoding,
    *,
    budgets: Sequence[int] | None = None,
) -> list[Generation]:
    """Cut each row at its end (EOS, the padding after it, or a stop string) and decode it; ``budgets``
    gives each row's own token budget (default: ``decoding.max_new_tokens``)."""
    ends = {*stop_ids, tokenizer.pad_token_id}
    answers: list[tuple[list[int], bool]] = []
    for row in rows:
        cut = next((position for position, token in enumerate(row) if token in ends), None)
        answers.append((list(row[:cut]), cut is None))
    texts = tokenizer.batch_decode([tokens for tokens, _ in answers], skip_special_tokens=True)
    limits = budgets if budgets is not None else [decoding.max_new_tokens] * len(answers)
    generations = []
    for text, (tokens, no_end), budget in zip(texts, answers, limits, strict=True):
        end: End = "eos"
        stops = [text.find(s) for s in decoding.stop if s and s in text]
        if stops:
            text, no_end, end = text[: min(stops)], False, "stop"
        truncated = no_end and len(tokens) >= budget
        if no_end:
            # No end token and no stop string in the text: the budget ran out, or a stop string matched
            # across tokens that decode to no text of their own.
            end = "length" if truncated else "stop"
        generations.append(Generation(text=text, tokens=len(tokens), truncated=truncated, end=end))
    return generations
