"""The toy run's evald config the benchmarks write: a SQLite database, the run ``toy``, the task ``arith``."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = """\
[database]
url = "sqlite:///{db}"

[[runs]]
name = "toy"
root = "{root}"

[[tasks]]
name = "arith"
dataset = "{dataset}"
prompt_field = "problem"
id_field = "id"
{task}
{sections}
[daemon]
state_dir = "{state}"
{daemon}"""

#: The task's lines for a run that evaluates the toy model (its prompt, its answers' length).
EVALUATED = 'prompt_template = "{prompt}="\nmax_new_tokens = 12\n'


def toy_config(
    db: Path, root: Path, dataset: Path, state: Path, *, task: str = "", sections: str = "", daemon: str = ""
) -> str:
    """The config's text; ``task``, ``sections`` and ``daemon`` are TOML lines added to the task, before
    the ``[daemon]`` section and to it."""
    return TEMPLATE.format(
        db=db, root=root, dataset=dataset, state=state, task=task, sections=sections, daemon=daemon
    )
