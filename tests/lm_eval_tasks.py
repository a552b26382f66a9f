"""lm-eval task folders whose two filters map to one evald metric name (``boxed-digits`` and
``boxed_digits`` both become ``exact_match_boxed_digits``), written as a user would write them.

- :func:`colliding_yaml`: the toy ``arith`` task with both filters in its YAML (``config check`` can see
  them and refuses the config).
- :func:`colliding_python_task`: the same task with its filters set by a Python task class (lm-eval's
  ``class:``), which no reading of the YAML can know: only the job finds the collision, after lm-eval ran.
"""

from __future__ import annotations

from pathlib import Path

TOY_TASKS = Path(__file__).resolve().parent.parent / "inference" / "toy" / "lm_eval"
TOY_DATA = TOY_TASKS.parent / "data" / "arith500.jsonl"

#: The two filters: the contents of the last \boxed{...}, under names that differ only by - and _.
FILTERS = """\
filter_list:
  - name: boxed-digits
    filter:
      - function: regex
        regex_pattern: "\\\\\\\\boxed\\\\{([0-9]*)\\\\}"
        group_select: -1
      - function: take_first
  - name: boxed_digits
    filter:
      - function: regex
        regex_pattern: "\\\\\\\\boxed\\\\{([^{}]*)\\\\}"
        group_select: -1
      - function: take_first
"""

TASK_CLASS = '''\
"""The toy arith task whose filters are chosen in code, as a Python task may."""

from lm_eval.api.task import ConfigurableTask

FILTERS = [
    {
        "name": "boxed-digits",
        "filter": [
            {"function": "regex", "regex_pattern": r"\\\\boxed\\{([0-9]*)\\}", "group_select": -1},
            {"function": "take_first"},
        ],
    },
    {
        "name": "boxed_digits",
        "filter": [
            {"function": "regex", "regex_pattern": r"\\\\boxed\\{([^{}]*)\\}", "group_select": -1},
            {"function": "take_first"},
        ],
    },
]


class BoxedTask(ConfigurableTask):
    def __init__(self, config=None):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config={**config, "filter_list": FILTERS})
'''


def _arith(name: str) -> str:
    """The shipped arith YAML as task ``name``, its data file absolute and without its filters."""
    shipped = (TOY_TASKS / "arith.yaml").read_text(encoding="utf-8")
    text = shipped.replace("task: arith", f"task: {name}").replace("../data/arith500.jsonl", str(TOY_DATA))
    return text[: text.index("filter_list:")] + text[text.index("metric_list:") :]


def colliding_yaml(folder: Path, name: str = "arith_boxed") -> Path:
    """A task folder holding ``name``.yaml with the two colliding filters."""
    folder.mkdir(parents=True, exist_ok=True)
    text = _arith(name)
    (folder / f"{name}.yaml").write_text(text.replace("metric_list:", FILTERS + "metric_list:"))
    return folder


def colliding_python_task(folder: Path, name: str = "arith_boxed_py") -> Path:
    """A task folder holding ``name``.yaml, a ``class:`` task whose code adds the two colliding filters."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "boxed_task.py").write_text(TASK_CLASS)
    text = _arith(name).replace(f"task: {name}\n", f"task: {name}\nclass: !function boxed_task.BoxedTask\n")
    (folder / f"{name}.yaml").write_text(text)
    return folder
