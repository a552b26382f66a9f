"""One evaluation job, end to end: dataset, model, generation, grading, metrics, samples.

Everything that can be checked without the model (task, metrics, dataset) is checked first, so a bad
input fails in milliseconds rather than after loading the weights.
"""

from __future__ import annotations

import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from inference.consistency import settle, token_digest
from inference.dataset import Item, load_dataset
from inference.errors import TaskInvalid
from inference.faults import Faults
from inference.generation import Batch, Decoding, Generation, prepare_batches, run_batches, token_lengths
from inference.grading import Grade, grade
from inference.group import WorkerGroup, head_results
from inference.layouts import LayoutSettings
from inference.metrics import EvalRecord, SampleRecord, compute_metrics, resolve_metrics
from inference.sampling import stratified_subset
from inference.spec import Consistency, Disagreement, JobResult, JobSpec, SampleOutput, TaskSpec, Timing
from inference.topology import deal_by_length, restore_order

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

log = structlog.get_logger("inference.task")

#: Closes text cut to ``max_text_chars``.
CUT_MARKER = "…[cut]"


def render_prompts(task: TaskSpec, items: Sequence[Item]) -> list[str]:
    """Apply ``task.prompt_template``; a template that does not format is :class:`TaskInvalid`."""
    template = task.prompt_template
    where = f"task {task.name!r}: prompt_template {template!r}"
    try:
        fields = {field for _, field, _, _ in string.Formatter().parse(template) if field is not None}
    except ValueError as exc:
        raise TaskInvalid(f"{where}: {exc} (write a literal brace as '{{{{' or '}}}}')") from exc
    if fields != {"prompt"}:
        raise TaskInvalid(f"{where}: needs exactly the placeholder {{prompt}}, has {sorted(fields)}")
    try:
        return [template.format(prompt=item.prompt) for item in items]
    except (KeyError, IndexError, ValueError) as exc:
        raise TaskInvalid(f"{where}: does not format: {exc!r}") from exc


def select_items(task: TaskSpec, items: Sequence[Item]) -> tuple[Item, ...]:
    """The items ``task`` evaluates: all of ``items``, or its subset (the same at every checkpoint)."""
    subset = task.subset
    if subset is None:
        return tuple(items)
    stratum = None if subset.stratify_field is None else _stratum
    return tuple(stratified_subset(items, subset.size, seed=subset.seed, stratum=stratum))


def _stratum(item: Item) -> str:
    # Never None here: load_dataset fills every stratum when the subset names a stratify_field.
    return "" if item.stratum is None else item.stratum


def cut_text(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its start and :data:`CUT_MARKER`."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(CUT_MARKER))] + CUT_MARKER


def _cut_optional(text: str | None, limit: int) -> str | None:
    return None if text is None else cut_text(text, limit)


def _samples(
    spec: JobSpec,
    items: Sequence[Item],
    prompts: Sequence[str],
    records: Sequence[SampleRecord],
    responses: Sequence[str],
    grades: Sequence[Grade],
) -> tuple[SampleOutput, ...]:
    limit = spec.max_text_chars
    return tuple(
        SampleOutput(
            index=index,
            prompt_id=items[index].prompt_id,
            prompt=cut_text(prompts[index], limit),
            response=cut_text(responses[index], limit),
            extracted=_cut_optional(grades[index].extracted, limit),
            reference=cut_text(items[index].reference, limit),
            correct=records[index].correct,
            tokens=records[index].tokens,
            truncated=records[index].truncated,
        )
        for index in range(min(spec.max_samples, len(items)))
    )


def run_task(spec: JobSpec, group: WorkerGroup, faults: Faults | None = None) -> JobResult | None:
    """Evaluate ``spec.checkpoint_path`` on ``spec.task`` as one rank of ``group``; a rejected input
    raises InferenceError. Rank 0 returns the result, the other ranks None."""
    started = time.perf_counter()
    faults = faults or Faults()
    task = spec.task
    topology = group.topology
    metrics = resolve_metrics(task.metrics)
    items = load_dataset(
        task.dataset,
        prompt_field=task.prompt_field,
        answer_field=task.answer_field,
        id_field=task.id_field,
        limit=task.limit,
        stratify_field=None if task.subset is None else task.subset.stratify_field,
    )
    items = select_items(task, items)
    prompts = render_prompts(task, items)
    if task.n_samples > 1 and task.temperature == 0:
        raise TaskInvalid(f"task {task.name!r}: n_samples = {task.n_samples} needs temperature > 0")

    # Imported only now: a job with a bad dataset or task is rejected without paying for torch.
    import torch

    from inference.loader import load_model

    torch.manual_seed(spec.seed)
    if spec.inference.threads is not None:
        torch.set_num_threads(spec.inference.threads)
    # One folder per rank: a layout's conversion writes there, and ranks must not write over each other.
    scratch = spec.result_path.parent / "scratch" / f"rank-{topology.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    loaded = load_model(
        spec.checkpoint_path,
        spec.inference,
        layout=spec.layout,
        settings=LayoutSettings(hf_config=spec.hf_config),
        scratch=scratch,
        device=group.device if spec.inference.device.startswith("cuda") else None,
        tp_group=group.tp_group,
    )
    log.info("task.loaded", load_s=round(loaded.load_s, 3), items=len(items), rank=topology.rank)

    evaluation_started = time.perf_counter()
    decoding = Decoding(
        max_new_tokens=task.max_new_tokens,
        n_samples=task.n_samples,
        temperature=task.temperature,
        top_p=task.top_p,
        stop=task.stop,
        seed=spec.seed,
        simulate_oom_above=faults.oom_above_batch,
    )
    share = _replica_share(group, loaded.tokenizer, prompts, task.batch_size)
    vote = TpVote(group, faults)
    generated, latencies = run_batches(
        loaded.model,
        loaded.tokenizer,
        share.batches,
        decoding,
        item_keys=share.items,
        agree=vote if topology.tp > 1 else None,
        agree_ends=vote.ends if topology.tp > 1 else None,
    )
    mine = [(share.items[local], generations) for local, generations in generated.items()]
    parts = group.gather_to_root(
        ReplicaOutput(mine, sum(latencies), len(latencies), vote.checked, tuple(vote.disagreements))
        if topology.is_head
        else None
    )
    if parts is None:
        return None
    outputs: list[ReplicaOutput] = head_results(parts, topology)
    per_item = restore_order([out.generations for out in outputs], len(items))
    generations = [g for item in per_item for g in item]
    sample_items = [item for item in items for _ in range(task.n_samples)]
    sample_prompts = [prompt for prompt in prompts for _ in range(task.n_samples)]
    responses = [g.text for g in generations]
    grades = [grade(r, item.reference) for r, item in zip(responses, sample_items, strict=True)]
    records = tuple(
        SampleRecord(correct=g.correct, tokens=generation.tokens, truncated=generation.truncated)
        for g, generation in zip(grades, generations, strict=True)
    )
    # Replicas generate side by side: the generation took as long as the slowest of them.
    generation_s = max(out.generation_s for out in outputs)
    finished = time.perf_counter()
    record = EvalRecord(
        samples=records, generation_s=generation_s, load_s=loaded.load_s, wall_s=finished - started
    )
    values = compute_metrics(metrics, record)
    log.info(
        "task.evaluated",
        items=len(items),
        samples=len(generations),
        batches=sum(out.batches for out in outputs),
        generation_s=round(generation_s, 3),
        tokens=sum(g.tokens for g in generations),
    )
    consistency = None
    if topology.tp > 1:
        consistency = Consistency(
            batches_checked=sum(out.checked for out in outputs),
            disagreements=tuple(d for out in outputs for d in out.disagreements),
        )
    return JobResult(
        job_id=spec.job_id,
        metrics=values,
        samples=_samples(spec, sample_items, sample_prompts, records, responses, grades),
        timing=Timing(load_s=loaded.load_s, eval_s=finished - evaluation_started, total_s=finished - started),
        consistency=consistency,
    )


@dataclass(frozen=True)
class ReplicaShare:
    #: Positions in the eval set of this replica's items; batch indices point into this list.
    items: list[int]
    batches: list[Batch]


@dataclass(frozen=True)
class ReplicaOutput:
    """What a replica head sends to rank 0."""

    generations: list[tuple[int, list[Generation]]]
    generation_s: float
    batches: int
    checked: int
    disagreements: tuple[Disagreement, ...]


def _replica_share(
    group: WorkerGroup, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], batch_size: int
) -> ReplicaShare:
    """This replica's items and batches: dealt and tokenised by its tp head, then sent to its tp ranks
    so that every rank of the replica computes on exactly the same tensors."""
    topology = group.topology
    share = None
    if topology.is_head:
        mine = deal_by_length(token_lengths(tokenizer, prompts), topology.dp)[topology.replica]
        share = ReplicaShare(mine, prepare_batches(tokenizer, [prompts[i] for i in mine], batch_size))
    shared: ReplicaShare = group.share_from_head(share)
    return shared


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
        verdict = settle(self._group.gather_tp(token_digest(rows)))
        self.checked += 1
        if verdict.agreed:
            return rows
        self.disagreements.append(
            Disagreement(replica=topology.replica, batch=number, outvoted=verdict.outvoted, tie=verdict.tie)
        )
        if topology.is_head:
            log.warning(
                "tp.disagreement",
                replica=topology.replica,
                batch=number,
                outvoted=list(verdict.outvoted),
                tie=verdict.tie,
            )
        winner_rows: list[list[int]] = self._group.share_from(
            topology.head_of(topology.replica) + verdict.winner, rows
        )
        return winner_rows
