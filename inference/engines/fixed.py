"""The fixed-batch engine: left-padded batches of prompts of similar length through transformers'
``generate``, each batch decoding until its longest row ends.

It works with any model ``generate`` drives, DeepSpeed AutoTP's sharded ones included: at every step the
tp ranks vote on which rows have ended (:class:`~inference.stopping.RowEnds`), so all leave the loop
together, and after every batch on a digest of their tokens. A finished row goes on computing padding
until its batch ends, and the KV cache is sized by the batch's longest row: long, uneven responses are
where :mod:`inference.engines.continuous` is faster.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inference.engines.base import (
    Agreement,
    Decoding,
    EndAgreement,
    Engine,
    EngineRun,
    Generation,
    Request,
    Row,
    generations_of,
    stop_token_ids,
)
from inference.engines.batches import Batch, length_buckets

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from inference.entropy import EntropyMeter
    from inference.stopping import RowEnds, RowVote


class FixedEngine(Engine):
    name = "fixed"

    def run(self, requests: Sequence[Request], decoding: Decoding) -> EngineRun:
        batches = batches_of(requests, self.batch_size, self.tokenizer.pad_token_id)
        generated, latencies = run_batches(
            self.model,
            self.tokenizer,
            batches,
            decoding,
            item_keys=[r.key for r in requests],
            budgets=[r.budget(decoding) for r in requests],
        )
        return EngineRun({requests[i].index: g for i, g in generated.items()}, latencies)


def batches_of(requests: Sequence[Request], batch_size: int, pad_id: int) -> list[Batch]:
    """Left-padded batches of the requests' prompts, bucketed by length, as
    :func:`~inference.generation.prepare_batches` makes them from text; indices point into ``requests``."""
    import torch

    batches = []
    for bucket in length_buckets([len(r.prompt_ids) for r in requests], batch_size):
        width = max(len(requests[i].prompt_ids) for i in bucket)
        ids = [
            [pad_id] * (width - len(requests[i].prompt_ids)) + list(requests[i].prompt_ids) for i in bucket
        ]
        mask = [
            [0] * (width - len(requests[i].prompt_ids)) + [1] * len(requests[i].prompt_ids) for i in bucket
        ]
        batches.append(Batch(tuple(bucket), torch.tensor(ids), torch.tensor(mask)))
    return batches


@dataclass(frozen=True)
class Steering:
    """What steers one batch's decoding besides the batch and the policy (:class:`Decoding`)."""

    #: The prompts' items, in the batch's order: they seed their samples.
    seed_keys: Sequence[int]
    #: The prompts' own token budgets; None: ``max_new_tokens`` each.
    budgets: Sequence[int] | None = None
    #: Settles where rows end across tp ranks.
    vote: RowVote | None = None
    #: Records the policy's entropy at every step.
    meter: EntropyMeter | None = None


def generate_tokens(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch: Batch,
    decoding: Decoding,
    steering: Steering,
) -> list[list[int]]:
    """The generated token ids of one batch (prompt excluded, each row cut where it ended),
    ``n_samples`` rows per prompt, steered by ``steering``."""
    from transformers.generation.logits_process import LogitsProcessorList
    from transformers.generation.stopping_criteria import StoppingCriteriaList

    from inference.stopping import cut

    _refuse_simulated_oom(batch, decoding)
    device = next(iter(model.parameters())).device
    prompt_length = batch.input_ids.shape[1]
    budgets = list(steering.budgets or [decoding.max_new_tokens] * len(batch.indices))
    ends = _row_ends(model, tokenizer, decoding, prompt_length, budgets, steering.vote)
    # Causal LMs mix in GenerationMixin, which PreTrainedModel's annotations do not show; without
    # return_dict_in_generate the result is the token tensor. Decoding is greedy over what SeededDraw
    # left: transformers' own warpers (its top_k = 50 default, a checkpoint's generation_config.json)
    # would otherwise reshape the configured policy.
    # A prompt's samples are rows of their own, prompt-major, as num_return_sequences would lay them out
    # (which greedy decoding refuses).
    generator: Any = model
    output: torch.Tensor = generator.generate(
        input_ids=batch.input_ids.repeat_interleave(decoding.n_samples, dim=0).to(device),
        attention_mask=batch.attention_mask.repeat_interleave(decoding.n_samples, dim=0).to(device),
        use_cache=True,
        max_new_tokens=max(budgets),
        # Rows end by RowEnds alone (EOS included), so that every tp rank ends them alike.
        eos_token_id=None,
        stopping_criteria=StoppingCriteriaList([ends]),
        logits_processor=LogitsProcessorList(_processors(decoding, prompt_length, steering)),
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        repetition_penalty=1.0,
    )
    return cut(output[:, prompt_length:].tolist(), ends.ended_at)


def _refuse_simulated_oom(batch: Batch, decoding: Decoding) -> None:
    """The fault a test injects: a batch of more rows than ``simulate_oom_above`` runs out of memory."""
    import torch

    rows = len(batch.indices) * decoding.n_samples
    if decoding.simulate_oom_above is not None and rows > decoding.simulate_oom_above:
        raise torch.OutOfMemoryError(
            f"simulated: a batch of {rows} sequences needs more memory than the cap of "
            f"{decoding.simulate_oom_above} allows"
        )


def _row_ends(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    decoding: Decoding,
    prompt_length: int,
    budgets: Sequence[int],
    vote: RowVote | None,
) -> RowEnds:
    """Where each row ends: EOS, padding, a stop string or its prompt's budget (``budgets``, per prompt),
    as ``vote`` settles it across tp ranks."""
    from inference.stopping import RowEnds

    return RowEnds(
        prompt_length=prompt_length,
        end_ids=[*stop_token_ids(model, tokenizer), tokenizer.pad_token_id],
        tokenizer=tokenizer,
        stop=decoding.stop,
        vote=vote,
        budgets=[b for b in budgets for _ in range(decoding.n_samples)],
    )


def _processors(decoding: Decoding, prompt_length: int, steering: Steering) -> list[Any]:
    """The logits processors: the entropy meter, then (when sampling) each row's seeded draw."""
    from inference.engines.draws import SeededDraw, sample_seed

    processors: list[Any] = [steering.meter] if steering.meter is not None else []
    if decoding.temperature > 0:
        n = decoding.n_samples
        seeds = [sample_seed(decoding.seed, key, s) for key in steering.seed_keys for s in range(n)]
        processors.append(
            SeededDraw(
                prompt_length=prompt_length,
                seeds=seeds,
                temperature=decoding.temperature,
                top_p=decoding.top_p,
            )
        )
    return processors


def run_batches(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batches: Sequence[Batch],
    decoding: Decoding,
    *,
    item_keys: Sequence[int] | None = None,
    budgets: Sequence[int] | None = None,
    agree: Agreement | None = None,
    agree_ends: EndAgreement | None = None,
) -> tuple[dict[int, list[Generation]], list[float]]:
    """Generate every batch; returns each prompt's generations by prompt index, and the batch latencies.

    ``item_keys`` maps a prompt index to the item's position in the whole eval set, which seeds the
    item's samples (the same tokens in every run, whatever the batch); ``budgets`` maps it to its token
    budget.
    """
    import torch

    from inference.entropy import EntropyMeter

    stop_ids = stop_token_ids(model, tokenizer)
    results: dict[int, list[Generation]] = {}
    latencies: list[float] = []
    with torch.inference_mode():
        for number, batch in enumerate(batches):
            keys = [item_keys[i] for i in batch.indices] if item_keys is not None else list(batch.indices)
            limits = [budgets[i] if budgets is not None else decoding.max_new_tokens for i in batch.indices]
            started = time.perf_counter()
            vote = _for_batch(agree_ends, number)
            meter = EntropyMeter(decoding.temperature) if decoding.entropy else None
            steering = Steering(seed_keys=keys, budgets=limits, vote=vote, meter=meter)
            rows = generate_tokens(model, tokenizer, batch, decoding, steering)
            if agree is not None:
                rows = agree(number, rows)
            latencies.append(time.perf_counter() - started)
            entropies = meter.per_row([len(row) for row in rows]) if meter is not None else None
            expanded = [limit for limit in limits for _ in range(decoding.n_samples)]
            generations = generations_of(
                [
                    Row(tuple(row), *(entropies[r] if entropies is not None else (0.0, 0)))
                    for r, row in enumerate(rows)
                ],
                expanded,
                tokenizer,
                stop_ids,
                decoding,
            )
            for position, index in enumerate(batch.indices):
                start = position * decoding.n_samples
                results[index] = generations[start : start + decoding.n_samples]
    return results, latencies


def _for_batch(agree_ends: EndAgreement | None, number: int) -> RowVote | None:
    if agree_ends is None:
        return None
    return lambda flags: agree_ends(number, flags)
