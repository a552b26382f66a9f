"""A task's dataset rows: every usable row as an item, and the rows left out, read the same way by the
worker (:mod:`inference.task`) and by the daemon's own check of its datasets (``evald run`` at start and
reload, ``evald config check``).

Its own module, beside the task's run, so that the daemon reads its datasets without importing the
worker's generation, judging and grading (``tests/test_daemon_imports.py`` holds it).
"""

from __future__ import annotations

from pathlib import Path

from inference.code.problems import CodeDataset, read_problems
from inference.dataset import Item, read_dataset
from inference.spec import CodeSpec, Problem, TaskSpec


def stratify_fields(task: TaskSpec) -> tuple[str, ...]:
    subsets = (task.subset, task.stage_subset)
    return tuple(s.stratify_field for s in subsets if s is not None and s.stratify_field is not None)


def read_rows(task: TaskSpec, path: Path) -> tuple[tuple[Item, ...], tuple[Problem, ...], CodeDataset | None]:
    """Every usable row of ``task``'s dataset as an item, the rows left out, and for a code task the
    problems with their tests (a dataset with no usable row is :class:`DatasetInvalid`)."""
    if task.kind == "code":
        read = read_problems(
            path,
            task.code or CodeSpec(),
            prompt_field=task.prompt_field,
            id_field=task.id_field,
            limit=task.limit,
            stratify_fields=stratify_fields(task),
        )
        return read.items, read.bad_rows, read
    likelihood = task.kind == "likelihood"
    dataset = read_dataset(
        path,
        prompt_field=task.text_field if likelihood else task.prompt_field,
        answer_field=None if likelihood else task.answer_field,
        id_field=task.id_field,
        limit=task.limit,
        stratify_fields=stratify_fields(task),
    )
    return dataset.items, dataset.problems, None
