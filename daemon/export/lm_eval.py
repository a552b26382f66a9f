"""``evald export lm-eval``: one checkpoint's results in lm-evaluation-harness's results JSON shape.

lm-eval writes ``results_<date>.json`` with ``results[task]["METRIC,FILTER"]`` (and
``"METRIC_stderr,FILTER"``), ``versions``, ``n-shot``, ``configs``, ``higher_is_better``, ``n-samples`` and
the run's ``config``; tools that read those files read this. evald's names go back to lm-eval's keys by
the table in :mod:`inference.harness.names`: exactly, for the metrics × filters a task's YAML lists
(read from ``lm_eval_include_path``), else by the table's filter short names. What evald does not store
(the task's full resolved config, the original document count under ``limit``) is left out or given as
what evald knows; evald's own tasks appear as tasks whose filter is ``none``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from daemon.config import Config, TaskConfig
from inference.harness.names import (
    FILTER_SHORT_NAMES,
    NO_FILTER,
    evald_name,
    lm_eval_keys,
    stderr_key,
)
from inference.metrics import higher_is_better
from storage.queries import ResultRow


def _yaml_config(task: TaskConfig, name: str) -> dict[str, Any]:
    """The task's own YAML from the include path (functions unresolved), or nothing."""
    if task.lm_eval_include_path is None:
        return {}
    from lm_eval.tasks._index import TaskIndex

    entries = TaskIndex.build([task.lm_eval_include_path])
    entry = entries.get(name)
    return dict(entry.cfg) if entry is not None and entry.cfg else {}


def _candidates(config: dict[str, Any]) -> list[tuple[str, str]]:
    metrics = [m["metric"] for m in config.get("metric_list", []) if isinstance(m, dict) and "metric" in m]
    filters = [f["name"] for f in config.get("filter_list", []) if isinstance(f, dict) and "name" in f]
    return [(metric, filter_name) for metric in metrics for filter_name in filters or [NO_FILTER]]


def _key(name: str, exact: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if name in exact and exact[name] != (name, NO_FILTER):
        return exact[name]
    for full, short in FILTER_SHORT_NAMES.items():
        if name.endswith(f"_{short}"):
            return name.removesuffix(f"_{short}"), full
    return name, NO_FILTER


def _latest_stage(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """A task evaluated in both stages at this step: its full stage's results."""
    full = {r.task for r in rows if r.stage == "full"}
    return [r for r in rows if r.stage == "full" or r.task not in full]


def lm_eval_results(rows: Sequence[ResultRow], config: Config, *, run: str, step: int) -> dict[str, Any]:
    """``rows`` (one run's results) at ``step`` as lm-eval's results document."""
    chosen = _latest_stage([r for r in rows if r.step == step])
    document: dict[str, Any] = {
        "results": {},
        "groups": {},
        "group_subtasks": {},
        "configs": {},
        "versions": {},
        "n-shot": {},
        "higher_is_better": {},
        "n-samples": {},
    }
    for evald_task in sorted({r.task for r in chosen}):
        task_rows = [r for r in chosen if r.task == evald_task]
        configured = config.task(evald_task)
        harness = configured is not None and configured.kind == "lm_eval"
        lm_task = (
            configured.lm_eval_task if harness and configured and configured.lm_eval_task else evald_task
        )
        for row in task_rows:
            subtask, slash, metric_name = row.metric.rpartition("/")
            name = subtask if slash else lm_task
            yaml = _yaml_config(configured, name) if harness and configured else {}
            exact = lm_eval_keys([metric_name], _candidates(yaml))
            metric, filter_name = _key(metric_name, exact) if harness else (metric_name, NO_FILTER)
            entry = document["results"].setdefault(name, {"alias": name})
            entry[f"{metric},{filter_name}"] = row.value
            entry[stderr_key(metric, filter_name)] = "N/A" if row.stderr is None else row.stderr
            document["higher_is_better"].setdefault(name, {})[metric] = higher_is_better(
                evald_name(metric, filter_name)
            )
            if row.n is not None:
                document["n-samples"][name] = {"original": row.n, "effective": row.n}
            metadata = yaml.get("metadata") if isinstance(yaml.get("metadata"), dict) else {}
            document["versions"][name] = (metadata or {}).get("version", "evald")
            fewshot = configured.num_fewshot if configured is not None else None
            document["n-shot"][name] = fewshot if fewshot is not None else yaml.get("num_fewshot", 0)
            stored = {k: v for k, v in yaml.items() if k != "metadata"}
            document["configs"].setdefault(name, {"task": name, **stored})
            if slash:
                document["group_subtasks"].setdefault(lm_task, [])
                if name not in document["group_subtasks"][lm_task]:
                    document["group_subtasks"][lm_task].append(name)
    if not chosen:
        raise LookupError(f"run {run!r} has no stored result at step {step}")
    first = chosen[0]
    limits = {t.limit for t in config.tasks if t.name in {r.task for r in chosen}}
    document["config"] = {
        "model": "hf",
        "model_args": f"pretrained={first.checkpoint}",
        "batch_size": next(iter({t.batch_size for t in config.tasks if t.name == first.task}), None),
        "limit": next(iter(limits)) if len(limits) == 1 else None,
        "evald_run": run,
        "step": step,
    }
    document["model_name"] = first.checkpoint
    document["date"] = max(r.evaluated_at for r in chosen).timestamp()
    return document


def write(document: dict[str, Any], out: Path | None) -> str:
    import json

    text = json.dumps(document, indent=2, default=str, allow_nan=True)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    return text
