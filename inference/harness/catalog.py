"""Which task names lm-eval knows: the config's ``lm_eval_task`` is checked when the config is loaded.

lm-eval finds a task by indexing every YAML file it ships (about 14,000, each parsed with its includes:
a minute and more) plus those under ``include_path``. evald indexes ``include_path`` exactly as lm-eval
does (with lm-eval's own code; a user's folder is small), and lm-eval's own tasks by reading the top-level
``task:``, ``group:`` and ``tag:`` keys of its YAML files and of the templates they include as text
(seconds, once per process). That reading finds every name lm-eval registers and a few it does not (a
template's placeholder): a name it lacks is unknown to lm-eval for certain, and the rare name it admits
wrongly fails the job with lm-eval's reason.

A task of ``include_path`` is also checked for metric names that collide (:func:`.names.collisions`): its
YAML's metrics × filters (lm-eval's default metrics for its ``output_type`` when it lists none), and for a
group or tag every member the include path defines. lm-eval's own tasks, and the metrics a task's Python
code adds at run time, are checked by the job instead (:func:`.report.metric_values`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.errors import TaskInvalid
from inference.harness.names import NO_FILTER, collisions

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

_TOP_KEY = re.compile(r"^['\"]?(?:task|group|tag)['\"]?:[ \t]*(?P<value>[^#\n]*)", re.MULTILINE)
_LIST_ITEM = re.compile(r"^[ \t]*-[ \t]*(?P<item>[^#\n]*)")


@dataclass(frozen=True)
class IncludeIndex:
    """The tasks, groups and tags of an include path, and its YAML files that do not parse. ``configs``:
    each task's and group's YAML (includes merged, functions unresolved) and its file; ``members``: each
    tag's tasks."""

    names: frozenset[str]
    broken: tuple[tuple[Path, str], ...]
    configs: Mapping[str, tuple[Path, Mapping[str, Any]]] = field(default_factory=dict)
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)


def include_index(path: Path) -> IncludeIndex:
    """Index ``path`` as lm-eval does; a YAML file lm-eval would skip in silence is reported."""
    from lm_eval.tasks._index import Kind, TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    names: set[str] = set()
    broken: list[tuple[Path, str]] = []
    configs: dict[str, tuple[Path, Mapping[str, Any]]] = {}
    members: dict[str, frozenset[str]] = {}
    for yaml_path in sorted(path.glob("**/*.yaml")):
        if any(part in {"__pycache__", ".ipynb_checkpoints"} for part in yaml_path.parts):
            continue
        try:
            config: Any = load_yaml(yaml_path, resolve_func=False, recursive=True)
            entries: dict[str, Any] = {}
            TaskIndex.process_cfg(config, yaml_path, entries)
        except Exception as exc:
            # Whatever lm-eval's loader raises on a file is that file's problem, reported by name.
            broken.append((yaml_path, " ".join(f"{type(exc).__name__}: {exc}".split())))
            continue
        names.update(entries)
        for name, entry in entries.items():
            if entry.kind is Kind.TAG:
                members[name] = members.get(name, frozenset()) | frozenset(entry.tags)
            elif entry.cfg is not None:
                configs.setdefault(name, (yaml_path, entry.cfg))
    return IncludeIndex(frozenset(names), tuple(broken), configs, members)


def _default_metrics(output_type: object) -> list[str]:
    from lm_eval.api.registry import DEFAULT_METRIC_REGISTRY

    # lm-eval's TaskConfig defaults output_type to generate_until.
    return list(DEFAULT_METRIC_REGISTRY.get(str(output_type or "generate_until"), []))


def metric_keys(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The ``(metric, filter)`` keys lm-eval reports for a task's YAML: every metric by every filter."""
    listed = config.get("metric_list")
    if isinstance(listed, list):
        # Read with functions unresolved, a ``!function utils.score`` metric is the path ".../utils.score";
        # lm-eval names it by the function's __name__, which is "score" unless the module renames it.
        metrics = [
            m["metric"].rpartition("/")[2].rpartition(".")[2] if "/" in m["metric"] else m["metric"]
            for m in listed
            if isinstance(m, dict) and isinstance(m.get("metric"), str)
        ]
    else:
        metrics = _default_metrics(config.get("output_type"))
    filters_listed = config.get("filter_list")
    filters = (
        [f["name"] for f in filters_listed if isinstance(f, dict) and isinstance(f.get("name"), str)]
        if isinstance(filters_listed, list)
        else [NO_FILTER]
    )
    return [(metric, filter_name) for metric in metrics for filter_name in filters]


def _group_keys(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A group's own aggregated keys (``aggregate_metric_list``, each over its filters)."""
    keys: list[tuple[str, str]] = []
    for item in config.get("aggregate_metric_list") or []:
        if isinstance(item, dict) and isinstance(item.get("metric"), str):
            filters = item.get("filter_list") or [NO_FILTER]
            keys.extend((item["metric"], f) for f in (filters if isinstance(filters, list) else [filters]))
    return keys


def _tasks_of(
    name: str, inline: tuple[Path, Mapping[str, Any]] | None, index: IncludeIndex, seen: set[str]
) -> Iterator[tuple[str, Path, list[tuple[str, str]]]]:
    """Each lm-eval task (or group, for its aggregates) under ``name`` that ``index`` defines, with its
    file and keys; a member lm-eval defines elsewhere is left to the job."""
    if name in seen:
        return
    seen.add(name)
    found = inline or index.configs.get(name)
    if found is None:
        for member in sorted(index.members.get(name, ())):
            yield from _tasks_of(member, None, index, seen)
        return
    path, config = found
    if "class" in config:
        return  # A Python task: its metrics and filters are its code's (the job checks them).
    if "group" not in config:
        yield name, path, metric_keys(config)
        return
    yield name, path, _group_keys(config)
    listed = config.get("task")
    for item in listed if isinstance(listed, list) else [listed]:
        if isinstance(item, str):
            yield from _tasks_of(item, None, index, seen)
        elif isinstance(item, dict) and isinstance(item.get("group"), str):
            yield from _tasks_of(item["group"], (path, item), index, seen)
        elif isinstance(item, dict) and isinstance(item.get("task"), str):
            # An inline task: lm-eval lays its keys over the task of that name, if there is one.
            base = index.configs.get(item["task"], (path, {}))[1]
            yield from _tasks_of(item["task"], (path, {**base, **item}), index, seen)


def name_collisions(name: str, index: IncludeIndex) -> list[str]:
    """Every collision among the keys of the lm-eval tasks under ``name`` (itself, a group's members, a
    tag's tasks), each described with its task and file."""
    return [
        f"lm-eval task {task!r} ({path}): {collision.describe()}"
        for task, path, keys in _tasks_of(name, None, index, set())
        for collision in collisions(keys)
    ]


def _scalar(text: str) -> str:
    return text.strip().strip("'\"")


def yaml_names(text: str) -> set[str]:
    """The values of the top-level ``task``, ``group`` and ``tag`` keys of one YAML file, read as text."""
    names: set[str] = set()
    lines = text.splitlines()
    for match in _TOP_KEY.finditer(text):
        value = match["value"].strip()
        if value.startswith("["):
            names.update(_scalar(part) for part in value.strip("[]").split(","))
        elif value:
            names.add(_scalar(value))
        else:
            line = text.count("\n", 0, match.start()) + 1
            for following in lines[line:]:
                item = _LIST_ITEM.match(following)
                if item is None:
                    if following.strip() and not following[0].isspace():
                        break
                    continue
                names.add(_scalar(item["item"].removeprefix("task:").removeprefix("group:")))
    names.discard("")
    return names


@functools.cache
def builtin_names() -> frozenset[str]:
    """Every name lm-eval's own task folder may register (a superset; see the module's docstring)."""
    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent
    names: set[str] = set()
    for path in root.rglob("*"):
        # Templates that tasks include are YAML too, named "_default_template_yaml" or "flores".
        if path.is_file() and (path.name.endswith("yaml") or not path.suffix):
            names.update(yaml_names(path.read_text(encoding="utf-8", errors="replace")))
    return frozenset(names)


def check_task(name: str, include_path: Path | None) -> bool:
    """Raise :class:`TaskInvalid` unless lm-eval knows ``name``; True when ``include_path`` defines it
    (lm-eval need not index its own tasks then)."""
    if include_path is not None:
        if not include_path.is_dir():
            raise TaskInvalid(f"lm_eval_include_path {include_path}: not a folder")
        index = include_index(include_path)
        if name in index.names:
            found = name_collisions(name, index)
            if found:
                raise TaskInvalid("; ".join(found))
            return True
    else:
        index = IncludeIndex(frozenset(), ())
    if name in builtin_names():
        return False
    where = "lm-eval's own tasks" + ("" if include_path is None else f" or {include_path}")
    hint = ""
    if index.broken:
        path, reason = index.broken[0]
        more = f" (and {len(index.broken) - 1} more)" if len(index.broken) > 1 else ""
        hint = f"; {path} does not load{more}: {reason}"
    elif include_path is not None and index.names:
        hint = f"; {include_path} defines {', '.join(sorted(index.names)[:10])}"
    raise TaskInvalid(f"unknown lm-eval task {name!r}: not in {where}{hint}")


def task_manager(name: str, include_path: Path | None) -> TaskManager:
    """lm-eval's TaskManager for ``name``: indexing lm-eval's own tasks only when ``name`` needs them."""
    from lm_eval.tasks import TaskManager

    local = check_task(name, include_path)
    return TaskManager(
        include_path=None if include_path is None else str(include_path), include_defaults=not local
    )
