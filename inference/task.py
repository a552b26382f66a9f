"""One evaluation job, end to end: dataset, model, generation, grading, metrics, samples.

Everything that can be checked without the model (task, metrics, dataset) is checked first, so a bad
input fails in milliseconds rather than after loading the weights.
"""

from __future__ import annotations

import string
import time
from collections.abc import Sequence

import structlog

from inference.dataset import Item, load_dataset
from inference.errors import TaskInvalid
from inference.grading import Grade, grade
from inference.layouts import LayoutSettings
from inference.metrics import EvalRecord, SampleRecord, compute_metrics, resolve_metrics
from inference.sampling import stratified_subset
from inference.spec import JobResult, JobSpec, SampleOutput, TaskSpec, Timing

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


def run_task(spec: JobSpec) -> JobResult:
    """Evaluate ``spec.checkpoint_path`` on ``spec.task``; a rejected input raises InferenceError."""
    started = time.perf_counter()
    task = spec.task
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

    # Imported only now: a job with a bad dataset or task is rejected without paying for torch.
    import torch

    from inference.generation import generate
    from inference.loader import load_model

    torch.manual_seed(spec.seed)
    if spec.inference.threads is not None:
        torch.set_num_threads(spec.inference.threads)
    scratch = spec.result_path.parent / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    loaded = load_model(
        spec.checkpoint_path,
        spec.inference,
        layout=spec.layout,
        settings=LayoutSettings(hf_config=spec.hf_config),
        scratch=scratch,
    )
    log.info("task.loaded", load_s=round(loaded.load_s, 3), items=len(items))

    evaluation_started = time.perf_counter()
    run = generate(
        loaded.model,
        loaded.tokenizer,
        prompts,
        max_new_tokens=task.max_new_tokens,
        batch_size=task.batch_size,
    )
    responses = [generation.text for generation in run.generations]
    grades = [grade(response, item.reference) for response, item in zip(responses, items, strict=True)]
    records = tuple(
        SampleRecord(correct=g.correct, tokens=generation.tokens, truncated=generation.truncated)
        for g, generation in zip(grades, run.generations, strict=True)
    )
    finished = time.perf_counter()
    record = EvalRecord(
        samples=records, generation_s=run.generation_s, load_s=loaded.load_s, wall_s=finished - started
    )
    values = compute_metrics(metrics, record)
    log.info(
        "task.evaluated",
        items=len(items),
        batches=len(run.batch_latencies_s),
        generation_s=round(run.generation_s, 3),
        tokens=run.tokens,
    )
    return JobResult(
        job_id=spec.job_id,
        metrics=values,
        samples=_samples(spec, items, prompts, records, responses, grades),
        timing=Timing(load_s=loaded.load_s, eval_s=finished - evaluation_started, total_s=finished - started),
    )
