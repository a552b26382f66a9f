"""The config's datasets read once, as ``evald run`` (at start and reload) and ``evald config check`` do."""

from __future__ import annotations

from daemon.config import Config
from inference.errors import DatasetInvalid
from inference.rows import read_rows
from inference.spec import Problem


def dataset_problems(config: Config) -> list[Problem]:
    """Read every task's dataset once: a dataset with no usable row stops the start (it would fail every
    job) as :class:`DatasetInvalid`; the bad rows of a usable one are returned (each job reports them too)."""
    problems: list[Problem] = []
    for task in config.tasks:
        if task.dataset is None:
            # An lm_eval task: lm-eval reads its data, and reports a bad file as the job's error.
            continue
        two_stage = config.scheduling.two_stage.get(task.name)
        spec = task.spec(None if two_stage is None else two_stage.subset())
        _items, bad_rows, _code = read_rows(spec, task.dataset)
        problems.extend(bad_rows)
    return problems


def check_datasets(config: Config) -> None:
    """Every row of every dataset must be good (``evald config check``)."""
    problems = dataset_problems(config)
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more bad rows)" if len(problems) > 1 else ""
        raise DatasetInvalid(f"{first.where}: {first.message}{more}")
