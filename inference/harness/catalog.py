"""Which task names lm-eval knows: the config's ``lm_eval_task`` is checked when the config is loaded.

lm-eval finds a task by indexing every YAML file it ships (about 14,000, each parsed with its includes:
a minute and more) plus those under ``include_path``. evald indexes ``include_path`` exactly as lm-eval
does (with lm-eval's own code; a user's folder is small), and lm-eval's own tasks by reading the top-level
``task:``, ``group:`` and ``tag:`` keys of its YAML files and of the templates they include as text
(seconds, once per process). That reading finds every name lm-eval registers and a few it does not (a
template's placeholder): a name it lacks is unknown to lm-eval for certain, and the rare name it admits
wrongly fails the job with lm-eval's reason.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.errors import TaskInvalid

if TYPE_CHECKING:
    from lm_eval.tasks import TaskManager

_TOP_KEY = re.compile(r"^['\"]?(?:task|group|tag)['\"]?:[ \t]*(?P<value>[^#\n]*)", re.MULTILINE)
_LIST_ITEM = re.compile(r"^[ \t]*-[ \t]*(?P<item>[^#\n]*)")


@dataclass(frozen=True)
class IncludeIndex:
    """The tasks, groups and tags of an include path, and its YAML files that do not parse."""

    names: frozenset[str]
    broken: tuple[tuple[Path, str], ...]


def include_index(path: Path) -> IncludeIndex:
    """Index ``path`` as lm-eval does; a YAML file lm-eval would skip in silence is reported."""
    from lm_eval.tasks._index import TaskIndex
    from lm_eval.tasks._yaml_loader import load_yaml

    names: set[str] = set()
    broken: list[tuple[Path, str]] = []
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
    return IncludeIndex(frozenset(names), tuple(broken))


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
