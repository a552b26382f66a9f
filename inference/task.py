"""One evaluation job, end to end: dataset, model, generation (or scoring, for likelihood), grading,
rewards, metrics, samples.

Everything that can be checked without the model (task, metrics, dataset) is checked first, so a bad
input fails in milliseconds rather than after loading the weights.
"""

from __future__ import annotations

import dataclasses
import string
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from inference.code.judge import Judge
from inference.code.stream import JudgingStream
from inference.dataset import Item
from inference.errors import TaskInvalid
from inference.faults import Faults
from inference.generation import Encoding
from inference.grading import warm_up
from inference.group import WorkerGroup, head_results
from inference.layouts import LayoutSettings
from inference.likelihood import with_text_units
from inference.metrics import (
    REWARD_METRICS,
    DocumentRecord,
    EvalRecord,
    Metric,
    compute_metrics,
    resolve_metrics,
)
from inference.replica import Replica, ReplicaOutput
from inference.rewards import RewardProcess
from inference.rows import read_rows
from inference.samples import (
    Graded,
    SampleLimits,
    Scorer,
    builtin_scorer,
    grade_samples,
)
from inference.sampling import stratified_subset
from inference.spec import (
    BUILTIN_REWARD,
    CodeSpec,
    Consistency,
    JobResult,
    JobSpec,
    Problem,
    TaskSpec,
    Timing,
)
from inference.topology import restore_order

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from inference.loader import LoadedModel

log = structlog.get_logger("inference.task")


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
    """The items ``task`` evaluates: all of ``items``, or its subset and then its stage's (each the same
    at every checkpoint)."""
    chosen = tuple(items)
    for subset in (task.subset, task.stage_subset):
        if subset is not None:
            field = subset.stratify_field
            stratum = None if field is None else _stratum_by(field)
            chosen = tuple(stratified_subset(chosen, subset.size, seed=subset.seed, stratum=stratum))
    return chosen


def _stratum_by(field: str) -> Callable[[Item], str]:
    # Every item has the field: read_dataset reports a row without it.
    return lambda item: item.stratum_of(field)


def apply_chat_template(
    task: TaskSpec, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]
) -> list[str]:
    """Each prompt as a user message (after the system prompt, if any) in the tokenizer's chat template,
    ending with the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise TaskInvalid(
            f"task {task.name!r}: chat_template = true, but the checkpoint's tokenizer has no chat template "
            "(tokenizer_config.json or chat_template.jinja)"
        )
    system = [] if task.system_prompt is None else [{"role": "system", "content": task.system_prompt}]
    rendered = []
    for prompt in prompts:
        try:
            text = tokenizer.apply_chat_template(
                [*system, {"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:
            # A Jinja template is code: whatever it raises is the task's configuration error.
            raise TaskInvalid(
                f"task {task.name!r}: the chat template failed: {type(exc).__name__}: {exc}"
            ) from exc
        rendered.append(str(text))
    return rendered


def needs_reward(task: TaskSpec) -> bool:
    return task.reward is not None or any(name in REWARD_METRICS for name in task.metrics)


def peak_memory_mb(device: str | None) -> float:
    """The most memory this rank has held: torch's device allocations on a GPU, the resident set on a CPU."""
    import resource

    import torch

    if device is not None and device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**20
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_task(spec: JobSpec, group: WorkerGroup, faults: Faults | None = None) -> JobResult | None:
    """Evaluate ``spec.checkpoint_path`` on ``spec.task`` as one rank of ``group``; a rejected input
    raises InferenceError. Rank 0 returns the result, the other ranks None."""
    if spec.task.kind == "lm_eval":
        from inference.harness.evaluation import run_harness

        return run_harness(spec, group)
    started = time.perf_counter()
    faults = faults or Faults()
    task = spec.task
    topology = group.topology
    metrics = resolve_metrics(task.metrics, kind=task.kind, n_samples=task.n_samples)
    likelihood = task.kind == "likelihood"
    if task.dataset is None:
        raise TaskInvalid(f"task {task.name!r}: a {task.kind} task needs a dataset")
    items, bad_rows, code = _read_items(task, task.dataset, rank=topology.rank)
    prompts = [item.prompt for item in items] if likelihood else render_prompts(task, items)
    if task.n_samples > 1 and task.temperature == 0:
        raise TaskInvalid(f"task {task.name!r}: n_samples = {task.n_samples} needs temperature > 0")
    # A code task's samples are judged by running them, never by math-verify (whose parser would also build
    # syntax trees beside the judge's threads: see inference.code.runners.python._PARSING).
    warming = warm_up() if topology.rank == 0 and task.kind == "generate" and code is None else None
    # Built (and its module imported) now: a bad reward fails the job before the weights are loaded.
    with ExitStack() as cleanup:
        scorer = _scorer(task, cleanup) if topology.rank == 0 and not likelihood else None
        # Its threads judge samples while the model generates; an error stops what is queued.
        code = None if code is None else cleanup.enter_context(code)
        prepared = Prepared(
            metrics=metrics,
            items=items,
            prompts=prompts,
            problems=bad_rows,
            scorer=scorer,
            warming=warming,
            code=code,
            started=started,
        )
        return Evaluation(spec, group, faults, prepared).run()


def _read_items(
    task: TaskSpec, path: Path, *, rank: int
) -> tuple[tuple[Item, ...], tuple[Problem, ...], JudgingStream | None]:
    """The items ``task`` evaluates, the dataset rows left out and, for a code task on rank 0, its
    judging: the sandbox is started here, so a host without one fails the job before the weights load."""
    rows, bad_rows, code = read_rows(task, path)
    items = select_items(task, rows)
    if code is None or rank != 0:
        return items, bad_rows, None
    by_id = {problem.prompt_id: problem for problem in code.problems}
    chosen = [by_id[item.prompt_id] for item in items]
    judge = Judge(task.name, task.code or CodeSpec())
    judge.check(chosen)
    return items, bad_rows, JudgingStream(judge, chosen)


def _scorer(task: TaskSpec, cleanup: ExitStack) -> Scorer | None:
    if not needs_reward(task):
        return None
    if task.reward is None or task.reward == BUILTIN_REWARD:
        return builtin_scorer
    process = cleanup.enter_context(RewardProcess(task.reward, task.reward_timeout_s))
    return lambda prompt, response, reference, _graded: process(prompt, response, reference)


@dataclass(frozen=True)
class Prepared:
    """What :func:`run_task` checked and built before the weights load."""

    metrics: Sequence[Metric]
    items: Sequence[Item]
    #: The items' prompts, rendered by the task's template (a likelihood task's texts as they are).
    prompts: list[str]
    #: Dataset rows left out before the evaluation; grading may leave out more.
    problems: Sequence[Problem]
    scorer: Scorer | None
    #: The grader's warm-up, started on rank 0 of a generate task while the model loads.
    warming: threading.Thread | None
    #: A code task's judging on rank 0, fed batch by batch while the model generates.
    code: JudgingStream | None
    #: When the job started (``time.perf_counter``).
    started: float


class Evaluation:
    """One rank's evaluation of ``spec`` once its inputs are checked: the model loaded, this replica's
    part generated (or scored), and on rank 0 the replicas' outputs graded into the job's result."""

    def __init__(self, spec: JobSpec, group: WorkerGroup, faults: Faults, prepared: Prepared) -> None:
        self.spec = spec
        self.group = group
        self.prepared = prepared
        self.replica = Replica(spec, group, faults)

    def run(self) -> JobResult | None:
        """Rank 0's result; None on the other ranks."""
        loaded, device = self._load()
        prompts = self.prepared.prompts
        if self.spec.task.chat_template:
            prompts = apply_chat_template(self.spec.task, loaded.tokenizer, prompts)
        evaluation_started = time.perf_counter()
        mine = self._replica_output(loaded, prompts, device)
        topology = self.group.topology
        parts = self.group.gather_to_root(mine if topology.is_head else None)
        if parts is None:
            return None
        outputs: list[ReplicaOutput] = head_results(parts, topology)
        graded, documents = self._grade(outputs, prompts, loaded.tokenizer)
        finished = time.perf_counter()
        started = self.prepared.started
        timing = Timing(
            load_s=loaded.load_s,
            eval_s=finished - evaluation_started,
            total_s=finished - started,
            grading_s=0.0 if graded is None else graded.seconds,
        )
        return self._result(outputs, graded, documents, timing)

    def _load(self) -> tuple[LoadedModel, str | None]:
        """The model on this rank, and the group's device where it runs on a GPU."""
        spec, topology = self.spec, self.group.topology
        # Imported only now: a job with a bad dataset or task is rejected without paying for torch.
        import torch

        from inference.loader import load_model

        torch.manual_seed(spec.seed)
        if spec.inference.threads is not None:
            torch.set_num_threads(spec.inference.threads)
        # One folder per rank: a layout's conversion writes there, and ranks must not write over each other.
        scratch = spec.result_path.parent / "scratch" / f"rank-{topology.rank}"
        scratch.mkdir(parents=True, exist_ok=True)
        device = self.group.device if spec.inference.device.startswith("cuda") else None
        loaded = load_model(
            spec.checkpoint_path,
            spec.inference,
            layout=spec.layout,
            settings=LayoutSettings(
                hf_config=spec.hf_config, run_root=spec.run_root, base_model=spec.base_model
            ),
            scratch=scratch,
            device=device,
            tp_group=self.group.tp_group,
        )
        log.info(
            "task.loaded", load_s=round(loaded.load_s, 3), items=len(self.prepared.items), rank=topology.rank
        )
        return loaded, device

    def _replica_output(self, loaded: LoadedModel, prompts: list[str], device: str | None) -> ReplicaOutput:
        """This replica's generations (or scored documents), with the most memory this rank held."""
        task, inference = self.spec.task, self.spec.inference
        likelihood = task.kind == "likelihood"
        encoding = Encoding(
            add_special_tokens=not task.chat_template,
            max_length=task.max_length if likelihood else None,
        )
        share = self.replica.share(loaded.tokenizer, prompts, encoding)
        if likelihood:
            mine = self.replica.score(loaded, share)
        else:
            mine = self.replica.generate(loaded, share, self.prepared.metrics, self.prepared.code)
        # A single rank on a GPU has no group device: the configured one is where the model went.
        on_gpu = inference.device.startswith("cuda")
        peak = peak_memory_mb(device or (inference.device if on_gpu else None))
        return dataclasses.replace(mine, peak_memory_mb=peak)

    def _grade(
        self, outputs: Sequence[ReplicaOutput], prompts: list[str], tokenizer: PreTrainedTokenizerBase
    ) -> tuple[Graded | None, tuple[DocumentRecord, ...]]:
        """The replicas' samples graded (and a code task's judged), or a likelihood task's documents."""
        task, items = self.spec.task, self.prepared.items
        if task.kind == "likelihood":
            documents = with_text_units(
                restore_order([out.documents for out in outputs], len(items)),
                [item.prompt for item in items],
                tokenizer,
                task.max_length,
            )
            return None, documents
        per_item = restore_order([out.generations for out in outputs], len(items))
        generations = [g for item in per_item for g in item]
        if self.prepared.warming is not None:
            # Grading in two threads at once would only contend for the interpreter.
            self.prepared.warming.join(timeout=60)
        limits = SampleLimits(task.n_samples, self.spec.max_samples, self.spec.max_text_chars)
        executed = None
        judging_s = 0.0
        code = self.prepared.code
        if code is not None:
            # Only what was not judged during generation is waited for here.
            executed = code.results([[g.text for g in item] for item in per_item])
            judging_s = code.tail_s
        graded = grade_samples(task.name, items, prompts, generations, limits, self.prepared.scorer, executed)
        return dataclasses.replace(graded, seconds=graded.seconds + judging_s), ()

    def _result(
        self,
        outputs: Sequence[ReplicaOutput],
        graded: Graded | None,
        documents: tuple[DocumentRecord, ...],
        timing: Timing,
    ) -> JobResult:
        """The job's metrics over every replica's output, its left-out inputs, timing and consistency."""
        # Replicas run side by side: the evaluation took as long as the slowest of them.
        generation_s = max(sum(out.latencies) for out in outputs)
        latencies = tuple(latency for out in outputs for latency in out.latencies)
        record = EvalRecord(
            samples=() if graded is None else graded.records,
            documents=documents,
            generation_s=generation_s,
            batch_latencies_s=latencies,
            load_s=timing.load_s,
            wall_s=timing.total_s,
            peak_memory_mb=max(out.peak_memory_mb for out in outputs),
        )
        values = compute_metrics(self.prepared.metrics, record)
        problems = (*self.prepared.problems, *(() if graded is None else graded.problems))
        log.info(
            "task.evaluated",
            items=len(self.prepared.items),
            samples=len(record.samples),
            documents=len(documents),
            problems=len(problems),
            batches=len(latencies),
            generation_s=round(generation_s, 3),
            grading_s=round(timing.grading_s, 3),
        )
        checks = [(out.checked, out.disagreements) for out in outputs]
        return JobResult(
            job_id=self.spec.job_id,
            metrics=values,
            samples=() if graded is None else graded.outputs,
            problems=problems,
            timing=timing,
            consistency=Consistency.of_replicas(checks) if self.group.topology.tp > 1 else None,
        )


__all__ = ["read_rows", "render_prompts", "run_task", "select_items"]
