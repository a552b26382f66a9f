"""Batched generation with a Hugging Face causal LM (plain or sharded by DeepSpeed AutoTP).

Prompts are sorted by token length and cut into batches, so each batch pads as little as possible;
batches are left-padded (generation appends on the right) and decode with the KV cache. A batch is
prepared once (:func:`prepare_batches`, on the tp head) and can be sent as is to the other tp ranks.
Before every batch the random generators are re-seeded from the job's seed and the batch's items, so
sampling draws the same tokens on every tp rank and in every run.

A response ends at an EOS token or at the first stop string; ``tokens`` counts what was generated up to
there (the stop string included, padding and EOS not), and a response that used all ``max_new_tokens``
without ending is ``truncated``. With ``n_samples`` > 1 each prompt gets that many completions, in the
prompt's order (prompt-major).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from inference.entropy import EntropyMeter
    from inference.stopping import RowVote

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
class Batch:
    #: Positions of the batch's prompts in the caller's prompt list.
    indices: tuple[int, ...]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


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


@dataclass(frozen=True)
class GenerationRun:
    #: ``n_samples`` per prompt, prompt-major, in the prompts' order.
    generations: tuple[Generation, ...]
    #: Seconds each batch took, in the order the batches ran (shortest prompts first).
    batch_latencies_s: tuple[float, ...]

    @property
    def generation_s(self) -> float:
        return sum(self.batch_latencies_s)

    @property
    def tokens(self) -> int:
        return sum(g.tokens for g in self.generations)


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches of similar length (stable for equal lengths)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


@dataclass(frozen=True)
class Encoding:
    """How prompts become tokens: a chat template adds its own special tokens; scored text may be cut."""

    add_special_tokens: bool = True
    max_length: int | None = None

    def kwargs(self) -> dict[str, Any]:
        cut = {"truncation": True, "max_length": self.max_length} if self.max_length is not None else {}
        return {"add_special_tokens": self.add_special_tokens, **cut}


def token_lengths(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], encoding: Encoding = Encoding()
) -> list[int]:
    return [len(ids) for ids in tokenizer(list(prompts), **encoding.kwargs())["input_ids"]]


def prepare_batches(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    batch_size: int,
    encoding: Encoding = Encoding(),
) -> list[Batch]:
    """Left-padded batches of ``prompts``, bucketed by token length; the tokenizer must pad on the left."""
    batches = []
    for bucket in length_buckets(token_lengths(tokenizer, prompts, encoding), batch_size):
        encoded = tokenizer(
            [prompts[i] for i in bucket], return_tensors="pt", padding=True, **encoding.kwargs()
        )
        batches.append(Batch(tuple(bucket), encoded["input_ids"], encoded["attention_mask"]))
    return batches


def batch_seed(seed: int, key: Sequence[int]) -> int:
    """The seed for one batch: fixed by the job's seed and the batch's items, whatever ran before it."""
    digest = hashlib.sha256(repr((seed, tuple(key))).encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    configured: Any = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured])
    ids.add(tokenizer.eos_token_id)
    return sorted(i for i in ids if isinstance(i, int))


def generate_tokens(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch: Batch,
    decoding: Decoding,
    *,
    seed_key: Sequence[int],
    vote: RowVote | None = None,
    meter: EntropyMeter | None = None,
) -> list[list[int]]:
    """The generated token ids of one batch (prompt excluded, each row cut where it ended),
    ``n_samples`` rows per prompt; ``vote`` settles where rows end across tp ranks; ``meter`` records the
    policy's entropy at every step."""
    import torch
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    from inference.stopping import RowEnds, cut

    rows = len(batch.indices) * decoding.n_samples
    if decoding.simulate_oom_above is not None and rows > decoding.simulate_oom_above:
        raise torch.OutOfMemoryError(
            f"simulated: a batch of {rows} sequences needs more memory than the cap of "
            f"{decoding.simulate_oom_above} allows"
        )
    torch.manual_seed(batch_seed(decoding.seed, seed_key))
    # Exactly the configured policy: transformers' top_k = 50 default and a checkpoint's own
    # generation_config.json (top_k, min_p, repetition_penalty) would otherwise reshape it, and pass@k,
    # entropy and the RL trainer's own sampling would no longer agree.
    sampling: dict[str, Any] = (
        {
            "do_sample": True,
            "temperature": decoding.temperature,
            "top_p": decoding.top_p,
            "top_k": 0,
            "min_p": None,
            "repetition_penalty": 1.0,
        }
        if decoding.temperature > 0
        else {"do_sample": False, "repetition_penalty": 1.0}
    )
    device = next(iter(model.parameters())).device
    prompt_length = batch.input_ids.shape[1]
    ends = RowEnds(
        prompt_length=prompt_length,
        end_ids=[*stop_token_ids(model, tokenizer), tokenizer.pad_token_id],
        tokenizer=tokenizer,
        stop=decoding.stop,
        vote=vote,
    )
    # Causal LMs mix in GenerationMixin, which PreTrainedModel's annotations do not show; without
    # return_dict_in_generate the result is the token tensor.
    generator: Any = model
    output: torch.Tensor = generator.generate(
        input_ids=batch.input_ids.to(device),
        attention_mask=batch.attention_mask.to(device),
        use_cache=True,
        max_new_tokens=decoding.max_new_tokens,
        num_return_sequences=decoding.n_samples,
        # Rows end by RowEnds alone (EOS included), so that every tp rank ends them alike.
        eos_token_id=None,
        stopping_criteria=StoppingCriteriaList([ends]),
        logits_processor=LogitsProcessorList([meter] if meter is not None else []),
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    return cut(output[:, prompt_length:].tolist(), ends.ended_at)


def finish(
    rows: Sequence[Sequence[int]],
    tokenizer: PreTrainedTokenizerBase,
    stop_ids: Sequence[int],
    decoding: Decoding,
) -> list[Generation]:
    """Cut each row at its end (EOS, the padding after it, or a stop string) and decode it."""
    ends = {*stop_ids, tokenizer.pad_token_id}
    answers: list[tuple[list[int], bool]] = []
    for row in rows:
        cut = next((position for position, token in enumerate(row) if token in ends), None)
        answers.append((list(row[:cut]), cut is None))
    texts = tokenizer.batch_decode([tokens for tokens, _ in answers], skip_special_tokens=True)
    generations = []
    for text, (tokens, no_end) in zip(texts, answers, strict=True):
        stops = [text.find(s) for s in decoding.stop if s and s in text]
        if stops:
            text, no_end = text[: min(stops)], False
        generations.append(
            Generation(
                text=text, tokens=len(tokens), truncated=no_end and len(tokens) >= decoding.max_new_tokens
            )
        )
    return generations


def run_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batches: Sequence[Batch],
    decoding: Decoding,
    *,
    item_keys: Sequence[int] | None = None,
    agree: Agreement | None = None,
    agree_ends: EndAgreement | None = None,
) -> tuple[dict[int, list[Generation]], list[float]]:
    """Generate every batch; returns each prompt's generations by prompt index, and the batch latencies.

    ``item_keys`` maps a prompt index to the item's position in the whole eval set, and the batch's
    seed comes from those positions: the same job draws the same tokens in every run. (Another batch
    size or dp, which groups the items otherwise, draws others.)
    """
    import dataclasses

    import torch

    from inference.entropy import EntropyMeter

    stop_ids = stop_token_ids(model, tokenizer)
    results: dict[int, list[Generation]] = {}
    latencies: list[float] = []
    with torch.inference_mode():
        for number, batch in enumerate(batches):
            key = [item_keys[i] for i in batch.indices] if item_keys is not None else list(batch.indices)
            started = time.perf_counter()
            vote = _for_batch(agree_ends, number)
            meter = EntropyMeter(decoding.temperature) if decoding.entropy else None
            rows = generate_tokens(model, tokenizer, batch, decoding, seed_key=key, vote=vote, meter=meter)
            if agree is not None:
                rows = agree(number, rows)
            latencies.append(time.perf_counter() - started)
            generations = finish(rows, tokenizer, stop_ids, decoding)
            if meter is not None:
                entropies = meter.per_row([len(row) for row in rows])
                generations = [
                    dataclasses.replace(g, entropy_sum=total, entropy_tokens=steps)
                    for g, (total, steps) in zip(generations, entropies, strict=True)
                ]
            for position, index in enumerate(batch.indices):
                start = position * decoding.n_samples
                results[index] = generations[start : start + decoding.n_samples]
    return results, latencies


def _for_batch(agree_ends: EndAgreement | None, number: int) -> RowVote | None:
    if agree_ends is None:
        return None
    return lambda flags: agree_ends(number, flags)


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    decoding: Decoding,
    *,
    batch_size: int,
) -> GenerationRun:
    """Completions of ``prompts`` in one process."""
    batches = prepare_batches(tokenizer, prompts, batch_size)
    results, latencies = run_batches(model, tokenizer, batches, decoding)
    return GenerationRun(
        generations=tuple(g for i in range(len(prompts)) for g in results[i]),
        batch_latencies_s=tuple(latencies),
    )
