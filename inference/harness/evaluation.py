"""Run an lm-evaluation-harness task on the model the worker loaded (``kind = "lm_eval"``).

The checkpoint is loaded once, by evald's loader, on evald's device and engine; lm-eval's ``HFLM`` wraps
that model and tokenizer (with DeepSpeed at tp = 1 the model is already the engine's inner module), and
``simple_evaluate`` does the rest exactly as the ``lm_eval`` command would. Under tp × dp every rank runs
it (:mod:`.model`: each tp rank takes the same forward passes on its shard, the dp replicas split the
documents through lm-eval's own rank and world size), and rank 0 holds the results.

Everything lm-eval raises is converted here, at the boundary: a dataset it cannot reach while offline, a
data file that is missing, a YAML or a task's own code that fails. Each becomes the job's error in one
line, and the daemon goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from inference.code.harness import sandboxed_code_eval
from inference.errors import DatasetInvalid, InferenceError, TaskInvalid
from inference.group import head_results
from inference.harness.catalog import task_manager
from inference.harness.report import metric_values, sample_outputs
from inference.layouts import LayoutSettings
from inference.spec import (
    CodeSpec,
    Consistency,
    Disagreement,
    HarnessSpec,
    JobResult,
    JobSpec,
    MetricValue,
    SampleOutput,
    TaskSpec,
    Timing,
)

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from inference.group import WorkerGroup
    from inference.loader import LoadedModel

log = structlog.get_logger("inference.harness")

#: What to do about a dataset lm-eval could not fetch while offline (one line, in the job's error).
#: lm-eval tasks marked unsafe whose unsafe part is the model's code judged by ``code_eval``, which runs in
#: evald's sandbox here (:mod:`inference.code.harness`), so they may run. Other unsafe tasks (longproc's,
#: cruxeval's) execute code their own way, outside the sandbox, and lm-eval keeps refusing them.
SANDBOXED_CODE_TASKS = re.compile(r"(humaneval|mbpp)(_\w+)?")

OFFLINE_HINT = (
    "the worker runs offline (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1): download the dataset into the "
    "Hugging Face cache beforehand, or point the task's YAML at local files "
    "(dataset_path: json, dataset_kwargs: {data_files: FILE.jsonl}) in lm_eval_include_path"
)


def _harness(task: TaskSpec) -> HarnessSpec:
    if task.lm_eval is None:
        raise TaskInvalid(f"task {task.name!r}: kind = 'lm_eval' needs lm_eval_task")
    return task.lm_eval


@contextlib.contextmanager
def _working_directory(path: Path | None) -> Iterator[None]:
    """lm-eval resolves a YAML's relative ``data_files`` against the working directory: make it the
    include path, as for a user who runs ``lm_eval`` there."""
    if path is None:
        yield
        return
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextlib.contextmanager
def _no_environment_report() -> Iterator[None]:
    """``simple_evaluate`` ends by adding an environment report to its results (``add_env_info``: torch's
    ``collect_env``, which runs ``pip list``, ``nvidia-smi`` and compilers as subprocesses, a second or more
    of every job) that evald never keeps: the job's results are its metrics and samples. While it runs,
    that report is left out. ``evald export lm_eval`` still writes one, as lm-eval's files have it."""
    import lm_eval.evaluator

    before = lm_eval.evaluator.add_env_info
    lm_eval.evaluator.add_env_info = lambda storage: None
    try:
        yield
    finally:
        lm_eval.evaluator.add_env_info = before


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _offline(exc: BaseException) -> bool:
    """A dataset or file lm-eval tried to fetch from the Hub while offline (datasets raises the builtin
    ConnectionError; huggingface_hub its OfflineModeIsEnabled, a ConnectionError too)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionError) or type(seen).__name__ == "OfflineModeIsEnabled":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def _lm_eval_errors(task: TaskSpec, harness: HarnessSpec) -> Iterator[None]:
    import torch

    where = f"task {task.name!r}: lm-eval task {harness.task!r}"
    try:
        yield
    except (InferenceError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as exc:
        if _offline(exc):
            raise DatasetInvalid(
                f"{where} needs the Hugging Face Hub ({_one_line(exc)}); {OFFLINE_HINT}"
            ) from exc
        if isinstance(exc, FileNotFoundError):
            base = (
                ""
                if harness.include_path is None
                else f" (relative paths are read from {harness.include_path})"
            )
            raise DatasetInvalid(f"{where}: {_one_line(exc)}{base}") from exc
        # The task's YAML, its utils.py or lm-eval itself: the job fails with the reason, the worker logs
        # the traceback.
        log.exception("harness.failed", task=task.name, lm_eval_task=harness.task)
        raise TaskInvalid(f"{where} failed: {_one_line(exc)}") from exc


def _language_model(
    loaded: LoadedModel, task: TaskSpec, harness: HarnessSpec, group: WorkerGroup, peers: ProcessGroup | None
) -> Any:
    from inference.harness.model import ReplicaLM

    return ReplicaLM(
        group=group,
        peers=peers,
        pretrained=loaded.model,
        tokenizer=loaded.tokenizer,
        batch_size=task.batch_size,
        add_bos_token=harness.add_bos_token,
    )


def _quiet_lm_eval() -> None:
    # lm-eval logs every task's set-up at INFO and warns on passing a model instance: evald's choice.
    for name in ("lm-eval", "lm_eval"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run_harness(spec: JobSpec, group: WorkerGroup) -> JobResult | None:
    """Evaluate ``spec.checkpoint_path`` on ``spec.task``'s lm-eval task; rejected input raises
    InferenceError. The result holds every metric lm-eval reported and its logged samples."""
    started = time.perf_counter()
    task = spec.task
    harness = _harness(task)
    _quiet_lm_eval()
    try:
        manager = task_manager(harness.task, harness.include_path)
    except TaskInvalid as exc:
        raise TaskInvalid(f"task {task.name!r}: {exc.message}") from exc
    # Loaded only now: a bad task name is rejected without paying for torch and the model.
    loaded = _load(spec, group)
    evaluation_started = time.perf_counter()
    results, model = _evaluate(spec, group, loaded, manager)
    log.info("harness.served", replica=group.topology.replica, requests=dict(model.served))
    consistency = _consistency(group, model) if group.topology.tp > 1 else None
    if group.topology.rank != 0:
        # Replica 0's tp head holds the gathered results; the other ranks took part in every pass.
        log.info(
            "harness.evaluated",
            lm_eval_task=harness.task,
            eval_s=round(time.perf_counter() - evaluation_started, 3),
        )
        return None
    metrics, samples = _outputs(spec, results, loaded)
    finished = time.perf_counter()
    log.info(
        "harness.evaluated",
        lm_eval_task=harness.task,
        metrics=len(metrics),
        samples=len(samples),
        eval_s=round(finished - evaluation_started, 3),
    )
    return JobResult(
        job_id=spec.job_id,
        metrics=metrics,
        samples=samples,
        timing=Timing(load_s=loaded.load_s, eval_s=finished - evaluation_started, total_s=finished - started),
        consistency=consistency,
    )


def _load(spec: JobSpec, group: WorkerGroup) -> LoadedModel:
    """The checkpoint loaded by evald's loader on this rank's device, seeded and with its threads set."""
    import torch

    from inference.loader import load_model

    torch.manual_seed(spec.seed)
    if spec.inference.threads is not None:
        torch.set_num_threads(spec.inference.threads)
    # One folder per rank: a layout's conversion writes there, and ranks must not write over each other.
    scratch = spec.result_path.parent / "scratch" / f"rank-{group.topology.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    loaded = load_model(
        spec.checkpoint_path,
        spec.inference,
        layout=spec.layout,
        settings=LayoutSettings(hf_config=spec.hf_config, run_root=spec.run_root, base_model=spec.base_model),
        scratch=scratch,
        device=group.device if spec.inference.device.startswith("cuda") else None,
        tp_group=group.tp_group,
    )
    log.info(
        "harness.loaded",
        load_s=round(loaded.load_s, 3),
        lm_eval_task=_harness(spec.task).task,
        rank=group.topology.rank,
    )
    return loaded


def _evaluate(
    spec: JobSpec, group: WorkerGroup, loaded: LoadedModel, manager: Any
) -> tuple[dict[str, Any] | None, Any]:
    """lm-eval's ``simple_evaluate`` on the loaded model (every rank), its errors converted: what it
    returned (rank 0's results) and the model that served it."""
    from lm_eval import simple_evaluate

    task = spec.task
    harness = _harness(task)
    # Collective (every rank creates every peer group): before anything that may fail on one rank only.
    peers = group.peer_group()
    with (
        _lm_eval_errors(task, harness),
        _working_directory(harness.include_path),
        # code_eval (humaneval, mbpp) runs the model's code in the sandbox, never by exec in this process.
        sandboxed_code_eval(task.name, task.code or CodeSpec()),
        _no_environment_report(),
    ):
        model = _language_model(loaded, task, harness, group, peers)
        results: dict[str, Any] | None = simple_evaluate(
            model=model,
            tasks=[harness.task],
            task_manager=manager,
            num_fewshot=harness.num_fewshot,
            limit=task.limit,
            log_samples=True,
            confirm_run_unsafe_code=SANDBOXED_CODE_TASKS.fullmatch(harness.task) is not None,
        )
    return results, model


def _outputs(
    spec: JobSpec, results: dict[str, Any] | None, loaded: LoadedModel
) -> tuple[tuple[MetricValue, ...], tuple[SampleOutput, ...]]:
    """The metrics and samples of lm-eval's results (rank 0's); none at all fails the job, naming why."""
    task = spec.task
    harness = _harness(task)
    if results is None:
        raise TaskInvalid(f"task {task.name!r}: lm-eval returned no results for {harness.task!r}")
    try:
        metrics = metric_values(results)
    except TaskInvalid as exc:
        # Two keys of one name: the job fails naming both, never stores one and drops the other.
        raise TaskInvalid(f"task {task.name!r}: {exc.message}") from exc
    if not metrics:
        raise TaskInvalid(f"task {task.name!r}: lm-eval reported no metric for {harness.task!r}")
    tokenizer = loaded.tokenizer
    samples = sample_outputs(
        results.get("samples", {}),
        prefixed=len(results.get("results", {})) > 1,
        max_samples=spec.max_samples,
        max_text_chars=spec.max_text_chars,
        count_tokens=lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]),
    )
    return metrics, samples


def _consistency(group: WorkerGroup, model: Any) -> Consistency | None:
    """Every replica's tp comparison, on rank 0 (collective: every rank calls it); None elsewhere."""
    topology = group.topology
    mine = (model.checked, tuple(model.disagreements)) if topology.is_head else None
    parts = group.gather_to_root(mine)
    if parts is None:
        return None
    heads: list[tuple[int, tuple[Disagreement, ...]]] = head_results(parts, topology)
    return Consistency.of_replicas(heads)
