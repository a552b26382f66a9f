"""``evald export lm-eval``: one checkpoint's results as lm-evaluation-harness's own results file.

What ``lm_eval --output_path`` writes (``results_<date>.json``), key for key, so anything that reads those
files (lm-eval's ``make_table``, its schema ``lm_eval.result_schema.EvalResults``, leaderboards, W&B's
lm-eval logger) reads this unchanged:

- for an lm-eval task (``kind = "lm_eval"``), lm-eval itself builds the document: the task (or group) is
  loaded through lm-eval's ``TaskManager`` from ``lm_eval_include_path`` as the worker loaded it (in that
  folder, offline), the stored values go in as its aggregated metrics, and lm-eval's own result assembly
  (``lm_eval.evaluator_utils``: ``EvalAcc``, ``aggregate_groups``, ``_to_eval_results``) writes
  ``results`` (with ``name``, ``alias``, ``sample_len``; a group's own entry, and its aggregate where the
  group defines one), ``groups`` only where lm-eval writes it, ``group_subtasks``, ``configs`` (each task's
  parsed config, ``task.dump_config()``), ``versions``, ``n-shot``, ``higher_is_better`` and ``n-samples``
  (``original``: the documents of the split; ``effective``: those evaluated). evald's names go back to
  lm-eval's ``metric,filter`` keys by the table in :mod:`inference.harness.names`, against the task's own
  metrics × filters;
- evald's own tasks appear as tasks whose filter is ``none``, version ``evald``;
- the top-level keys ``simple_evaluate`` and its tracker add: ``config`` (``model_args`` with the
  checkpoint's **path** as ``pretrained``, the model's parameter count read from its config on the meta
  device, no weights loaded), ``model_name`` (the path) and ``model_name_sanitized``, lm-eval's own
  environment and tokenizer fields (``add_env_info``, ``add_tokenizer_info``: this machine's versions, and
  the checkpoint's tokenizer), ``date`` (when the job finished) and ``total_evaluation_time_seconds``.

What evald does not keep is what lm-eval writes without it: ``task_hashes`` is ``{}`` (as lm-eval's without
``--log_samples``), ``git_hash`` and chat fields ``null``. One key is evald's own: ``evald`` (run, step,
checkpoint, evald task names), which lm-eval's readers ignore.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.config import Config, TaskConfig
from daemon.errors import EvaldError
from inference.harness.names import (
    FILTER_SHORT_NAMES,
    NO_FILTER,
    lm_eval_keys,
    stderr_key,
)
from inference.metrics import higher_is_better
from storage.queries import ResultRow

#: What the worker passes ``simple_evaluate`` by default (the seeds and bootstrap are lm-eval's defaults).
BOOTSTRAP_ITERS = 100_000
SEEDS = {"random_seed": 0, "numpy_seed": 1234, "torch_seed": 1234, "fewshot_seed": 1234}


class ExportError(EvaldError):
    """The document cannot be written as lm-eval writes it: the message names why and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    """What the export knows of the evaluated checkpoint and job."""

    path: str
    #: Seconds the evaluation took (the jobs' durations summed), or None.
    duration_s: float | None = None


def _latest_stage(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """A task evaluated in both stages at this step: its full stage's results."""
    full = {r.task for r in rows if r.stage == "full"}
    return [r for r in rows if r.stage == "full" or r.task not in full]


@contextmanager
def _lm_eval_folder(include_path: Path | None) -> Iterator[None]:
    """As the worker runs lm-eval: in the include path (a YAML's relative ``data_files`` resolve there),
    offline (the dataset comes from the cache the worker filled, never from the network)."""
    before = Path.cwd()
    saved = {k: os.environ.get(k) for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    os.environ.update({k: "1" for k in saved})
    try:
        if include_path is not None:
            os.chdir(include_path)
        yield
    finally:
        os.chdir(before)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _model_args(checkpoint: Checkpoint, config: Config) -> dict[str, Any]:
    # As the lm_eval command records ``--model_args pretrained=PATH,dtype=...``.
    return {"pretrained": checkpoint.path, "dtype": config.inference.dtype}


def _load(task: TaskConfig, metadata: dict[str, Any]) -> dict[str, Any]:
    """lm-eval's ``{"tasks": {name: Task}, "groups": {name: Group}}`` for the task, as the worker built it,
    with ``num_fewshot`` settled as ``simple_evaluate`` settles it."""
    from lm_eval.tasks import TaskManager

    from inference.errors import TaskInvalid
    from inference.harness.catalog import check_task

    name = task.lm_eval_task or task.name
    try:
        local = check_task(name, task.lm_eval_include_path)
    except TaskInvalid as exc:
        raise ExportError(f"task {task.name!r}: {exc.message}") from exc
    include = None if task.lm_eval_include_path is None else str(task.lm_eval_include_path)
    try:
        with _lm_eval_folder(task.lm_eval_include_path):
            manager = TaskManager(include_path=include, include_defaults=not local, metadata=metadata)
            loaded: dict[str, Any] = manager.load([name])
    except Exception as exc:  # lm-eval raises whatever its loaders raise; the export names the task
        reason = " ".join(str(exc).split())[:300]
        raise ExportError(
            f"task {task.name!r}: lm-eval cannot load {name!r} to write its config ({type(exc).__name__}: "
            f"{reason}); export where the task's dataset is (the worker's machine and cache)"
        ) from exc
    for task_obj in loaded["tasks"].values():
        if task.num_fewshot is not None and task_obj.get_config("num_fewshot") != 0:
            task_obj.set_config(key="num_fewshot", value=task.num_fewshot)
        elif task_obj.get_config("num_fewshot") is None:
            task_obj.set_config(key="num_fewshot", value=0)
    return loaded


def _candidates(task_obj: Any, task_config: dict[str, Any]) -> list[tuple[str, str]]:
    """The task's ``(metric, filter)`` pairs: its metrics (defaults included) × its filters."""
    metrics = list(task_obj.higher_is_better())
    filters = [f["name"] for f in task_config.get("filter_list") or [] if isinstance(f, dict) and "name" in f]
    return [(metric, filter_name) for filter_name in filters or [NO_FILTER] for metric in metrics]


def _key(name: str, exact: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if name in exact and exact[name] != (name, NO_FILTER):
        return exact[name]
    for full, short in FILTER_SHORT_NAMES.items():
        if name.endswith(f"_{short}"):
            return name.removesuffix(f"_{short}"), full
    return name, NO_FILTER


def _values(rows: Sequence[ResultRow], candidates: list[tuple[str, str]]) -> tuple[dict[str, Any], int]:
    """Stored rows as lm-eval's aggregated ``{"metric,filter": value, "metric_stderr,filter": stderr}``,
    and the documents evaluated (lm-eval's ``sample_len``)."""
    names = [r.metric.rpartition("/")[2] for r in rows]
    exact = lm_eval_keys(names, candidates)
    values: dict[str, Any] = {}
    for row, name in zip(rows, names, strict=True):
        if row.no_samples or row.value is None:
            continue  # no number (a metric over no samples): lm-eval would have none either
        metric, filter_name = _key(name, exact)
        values[f"{metric},{filter_name}"] = row.value
        values[stderr_key(metric, filter_name)] = "N/A" if row.stderr is None else row.stderr
    counts = [r.n for r in rows if r.n is not None]
    return values, max(counts, default=0)


def _harness_parts(
    task: TaskConfig, rows: Sequence[ResultRow], acc: Any, metadata: dict[str, Any]
) -> list[str]:
    """Add one lm-eval task's (or group's) stored rows to lm-eval's accumulator ``acc``; the lm-eval
    names it added."""
    from lm_eval.result_schema import _SampleCount

    loaded = _load(task, metadata)
    name = task.lm_eval_task or task.name
    by_task: dict[str, list[ResultRow]] = {}
    several = len(loaded["tasks"]) > 1 or bool(loaded["groups"])
    for row in rows:
        subtask, slash, _ = row.metric.rpartition("/")
        by_task.setdefault(subtask if slash and several else name, []).append(row)
    added = []
    for task_name, task_obj in loaded["tasks"].items():
        task_config = dict(task_obj.dump_config())
        values, sample_len = _values(by_task.get(task_name, []), _candidates(task_obj, task_config))
        if task_name in acc.metrics:
            raise ExportError(f"lm-eval task {task_name!r} is in two of the evald tasks at this step")
        acc.metrics[task_name] = {
            "name": task_name,
            "alias": task_config.get("task_alias", task_name),
            "sample_len": sample_len,
            **values,
        }
        acc.configs[task_name] = task_config
        acc.versions[task_name] = task_obj.VERSION
        acc.num_fewshot[task_name] = task_config.get("num_fewshot", 0)
        acc.higher_is_better[task_name] = task_obj.higher_is_better()
        with _lm_eval_folder(task.lm_eval_include_path):
            original = len(task_obj.eval_docs)
        acc.n_samples[task_name] = _SampleCount(original=original, effective=sample_len)
        added.append(task_name)
    acc.groups.update(loaded["groups"])
    return added


def _own_task(document: dict[str, Any], evald_task: str, rows: Sequence[ResultRow], config: Config) -> None:
    """An evald task as lm-eval would show a task whose metrics have no filter."""
    values, sample_len = _values(rows, [])
    document["results"][evald_task] = {
        "name": evald_task,
        "alias": evald_task,
        "sample_len": sample_len,
        **values,
    }
    document["configs"][evald_task] = {"task": evald_task, "output_type": "evald"}
    document["versions"][evald_task] = "evald"
    configured = config.task(evald_task)
    fewshot = configured.num_fewshot if configured is not None else None
    document["n-shot"][evald_task] = fewshot or 0
    document["higher_is_better"][evald_task] = {
        key.partition(",")[0]: higher_is_better(key.partition(",")[0])
        for key in values
        if "_stderr," not in key
    }
    document["n-samples"][evald_task] = {"original": sample_len, "effective": sample_len}


def _model_info(checkpoint: Checkpoint, config: Config) -> tuple[dict[str, Any], Any]:
    """HFLM's ``get_model_info()`` fields and an object with the tokenizer fields lm-eval's
    ``add_tokenizer_info`` reads, from the checkpoint's config and tokenizer (no weights loaded)."""
    info: dict[str, Any] = {
        "model_num_parameters": None,
        "model_dtype": f"torch.{config.inference.dtype}",
        "model_revision": "main",
        "model_sha": "",
    }
    tokenizer_info = _TokenizerInfo()
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        model_config = AutoConfig.from_pretrained(checkpoint.path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config)  # type: ignore[no-untyped-call]
        info["model_num_parameters"] = model.num_parameters()
        tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
        from lm_eval.models.utils import resolve_max_length

        tokenizer_info = _TokenizerInfo(
            tokenizer, tokenizer.eos_token_id, resolve_max_length(model_config, tokenizer, default=2048)
        )
    except Exception:  # a checkpoint moved or converted since: the fields lm-eval would fill stay null
        pass
    return info, tokenizer_info


@dataclass(frozen=True)
class _TokenizerInfo:
    tokenizer: Any = None
    eot_token_id: int | None = None
    max_length: int | None = None


def _top_level(
    document: dict[str, Any], checkpoint: Checkpoint, config: Config, tasks: Sequence[TaskConfig]
) -> None:
    from lm_eval.loggers.utils import add_env_info, add_tokenizer_info
    from lm_eval.utils import sanitize_model_name

    model_info, tokenizer = _model_info(checkpoint, config)
    limits = {t.limit for t in tasks}
    limit = next(iter(limits)) if len(limits) == 1 else None
    batch_sizes = {t.batch_size for t in tasks}
    document["config"] = {
        "model": "hf",
        "model_args": _model_args(checkpoint, config),
        **model_info,
        "batch_size": str(next(iter(batch_sizes))) if len(batch_sizes) == 1 else None,
        "batch_sizes": [],
        "device": config.inference.device,
        "use_cache": None,
        "limit": None if limit is None else float(limit),
        "bootstrap_iters": BOOTSTRAP_ITERS,
        "gen_kwargs": None,
        **SEEDS,
    }
    document["git_hash"] = None
    add_env_info(document)
    if tokenizer.tokenizer is not None:
        add_tokenizer_info(document, tokenizer)
    else:
        for key in ("tokenizer_pad_token", "tokenizer_eos_token", "tokenizer_bos_token"):
            document[key] = None
        document["eot_token_id"] = document["max_length"] = None
    document["task_hashes"] = {}
    document["model_source"] = "hf"
    document["model_name"] = checkpoint.path
    document["model_name_sanitized"] = sanitize_model_name(checkpoint.path)
    for key in ("system_instruction", "system_instruction_sha", "fewshot_as_multiturn"):
        document[key] = None
    document["chat_template"] = document["chat_template_sha"] = None
    document["total_evaluation_time_seconds"] = (
        None if checkpoint.duration_s is None else str(checkpoint.duration_s)
    )


def lm_eval_results(
    rows: Sequence[ResultRow], config: Config, *, run: str, step: int, checkpoint: Checkpoint
) -> dict[str, Any]:
    """``rows`` (one run's results) at ``step`` as lm-eval's results document (module docstring)."""
    from lm_eval.evaluator_utils import EvalAcc, aggregate_groups

    chosen = _latest_stage([r for r in rows if r.step == step])
    if not chosen:
        raise LookupError(f"run {run!r} has no stored result at step {step}")
    acc = EvalAcc()
    metadata = _model_args(checkpoint, config)
    own: dict[str, list[ResultRow]] = {}
    tasks: list[TaskConfig] = []
    for evald_task in sorted({r.task for r in chosen}):
        task_rows = [r for r in chosen if r.task == evald_task]
        configured = config.task(evald_task)
        if configured is not None:
            tasks.append(configured)
        if configured is not None and configured.kind == "lm_eval":
            _harness_parts(configured, task_rows, acc, metadata)
        else:
            own[evald_task] = task_rows
    # lm-eval's own group aggregation (bottom-up, weighted by each subtask's sample_len) and assembly.
    document: dict[str, Any] = dict(aggregate_groups(acc)._to_eval_results())
    for evald_task, task_rows in own.items():
        _own_task(document, evald_task, task_rows, config)
    document["date"] = max(r.evaluated_at for r in chosen).timestamp()
    _top_level(document, checkpoint, config, tasks)
    # Where lm-eval puts ``date`` (after git_hash): the key order of its file, for readers that care.
    date = document.pop("date")
    ordered = {}
    for key, value in document.items():
        ordered[key] = value
        if key == "git_hash":
            ordered["date"] = date
    ordered["evald"] = {
        "run": run,
        "step": step,
        "checkpoint": checkpoint.path,
        "tasks": sorted({r.task for r in chosen}),
    }
    return ordered


def write(document: dict[str, Any], out: Path | None) -> str:
    # lm-eval's own serialisation: indent 2, non-JSON values by ``_handle_non_serializable``.
    from lm_eval.loggers.utils import _handle_non_serializable

    text = json.dumps(document, indent=2, default=_handle_non_serializable, ensure_ascii=False)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    return text
