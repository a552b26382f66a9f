"""Poison items beside good checkpoints: one bad item of each kind must not stop anything else.

Into the watched run go, at the same moment as the first good checkpoint: folders named ``step_2147483648``
(past PostgreSQL's integer), ``step_99999999999999999999`` (past SQLite's) and ``step_-1`` (once read as
step 1), each a whole toy checkpoint; a checkpoint ``step_6400`` holding a self-referencing symlink
(``l1 -> l1``); a symlink ``step_6201`` back to the run root itself; a checkpoint ``step_6500`` whose
``model.safetensors`` is a FIFO (an ``open`` of it blocks until a writer comes), one ``step_6600`` whose
``config.json`` nests 100,000 brackets (a RecursionError in the parser), and a root-level symlink
``step_6260`` to itself. The config also has an lm_eval
task (``boxed``) whose two filters, ``boxed-digits`` and ``boxed_digits``, map to one evald metric name;
its filters are set by the task's Python code, so no reading of the config can know, and each of its jobs
must fail naming both. Then more good checkpoints arrive one by one (three; none in ``--short``); the
daemon is restarted (SIGTERM, as systemd's restart) with every poison item still there, and one last good
checkpoint must be evaluated after it.

Counted: every good checkpoint evaluated once (``lost``, ``duplicated``) within ``ON_TIME_SECS`` of being
written (``late``); each poison checkpoint ``invalid`` (or dropped) with no job, each ``boxed`` job
``failed`` naming both filters (``unrefused``); each poison item named by the daemon's log, in one line per
daemon start for a checkpoint and one line per job for the task (``misnamed``); no daemon exit nobody
asked for (``crashes``: a start-up that fails on a poison item counts here). Run on SQLite and on
PostgreSQL (a private server, ``tests.pgcluster``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from reliability import checkpoints
from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.supervisor import Supervisor
from reliability.workspace import TASK, RunSpec, Workspace, wait_for, workspace, write_dataset
from storage.models import Checkpoint, CheckpointState, EvalJob, JobState
from tests.pgcluster import start_cluster

#: A good checkpoint is evaluated on time if its result is stored within this long of its last write
#: (a 2-core machine shared with other runs, behind the poison task's job of the checkpoint before it).
ON_TIME_SECS = 240.0
POISON_TASK = "boxed"
FILTERS = ("boxed-digits", "boxed_digits")
TOY_TASKS = Path(__file__).resolve().parents[2] / "inference" / "toy" / "lm_eval"

#: The poison lm_eval task: the toy ``arith`` task whose code sets two filters that differ only by - and _.
TASK_CODE = '''\
"""The toy arith task whose filters are chosen in code (lm-eval's ``class:``), as a Python task may."""

from lm_eval.api.task import ConfigurableTask

FILTERS = [
    {
        "name": name,
        "filter": [
            {"function": "regex", "regex_pattern": r"\\\\boxed\\{([^{}]*)\\}", "group_select": -1},
            {"function": "take_first"},
        ],
    }
    for name in ("boxed-digits", "boxed_digits")
]


class BoxedTask(ConfigurableTask):
    def __init__(self, config=None):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config={**config, "filter_list": FILTERS})
'''

TASK_TOML = """\
[[tasks]]
name = "{name}"
kind = "lm_eval"
lm_eval_task = "{name}"
lm_eval_include_path = "{folder}"
limit = 2
batch_size = 4

"""


@dataclass(frozen=True)
class PoisonFolder:
    """A poison item in the run root, and the pattern that names it in a log line."""

    name: str
    what: str

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.escape(self.name) + r"(?![0-9])")


POISON_FOLDERS = (
    PoisonFolder("step_2147483648", "a step past PostgreSQL's integer"),
    PoisonFolder("step_99999999999999999999", "a step past SQLite's integer"),
    PoisonFolder("step_-1", "a negative step"),
    PoisonFolder("step_6400", "a checkpoint holding a self-referencing symlink"),
    PoisonFolder("step_6201", "a symlink to the run root"),
    PoisonFolder("step_6500", "a checkpoint whose model.safetensors is a FIFO (a read would block)"),
    PoisonFolder("step_6600", "a checkpoint whose config.json nests 100,000 brackets"),
    PoisonFolder("step_6260", "a run-root symlink to itself (step_6260 -> step_6260)"),
)


def write_poison_task(folder: Path) -> Path:
    """``folder`` holding the ``boxed`` task: the shipped arith YAML, its data absolute, filters in code."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "boxed_task.py").write_text(TASK_CODE, encoding="utf-8")
    shipped = (TOY_TASKS / "arith.yaml").read_text(encoding="utf-8")
    text = shipped.replace("task: arith\n", f"task: {POISON_TASK}\nclass: !function boxed_task.BoxedTask\n")
    text = text.replace("../data/", f"{TOY_TASKS.parent / 'data'}/")
    text = text[: text.index("filter_list:")] + text[text.index("metric_list:") :]
    (folder / f"{POISON_TASK}.yaml").write_text(text, encoding="utf-8")
    return folder


def write_poison_folders(root: Path, staging: Path) -> None:
    """Each poison folder made whole in ``staging`` and moved into ``root`` in one rename, so the daemon
    never sees a folder that is not yet poison."""
    staging.mkdir(parents=True, exist_ok=True)
    for item in POISON_FOLDERS:
        target = root / item.name
        if item.name == "step_6201":
            target.symlink_to(root, target_is_directory=True)
            continue
        if item.name == "step_6260":
            target.symlink_to(item.name)
            continue
        made = staging / item.name
        shutil.copytree(checkpoints.toy_checkpoint(), made)
        if item.name == "step_6400":
            (made / "l1").symlink_to("l1")
        if item.name == "step_6500":
            (made / "model.safetensors").unlink()
            os.mkfifo(made / "model.safetensors")
        if item.name == "step_6600":
            (made / "config.json").write_text("[" * 100_000, encoding="utf-8")
        made.rename(target)


def run_sqlite(options: Options) -> Figures:
    return _run(options, "SQLite")


def run_postgres(options: Options) -> Figures:
    return _run(options, "PostgreSQL")


@contextmanager
def _database_url(backend: str) -> Iterator[str | None]:
    if backend == "SQLite":
        yield None
        return
    cluster = start_cluster()
    try:
        yield cluster.create_database("evald_poison")
    finally:
        cluster.destroy()


def _run(options: Options, backend: str) -> Figures:
    good = options.pick(short=1, full=4)
    figures = Figures(f"poison items beside good checkpoints ({backend})")
    with (
        _database_url(backend) as url,
        workspace(f"poison-{backend.lower()}", options.workdir, url=url) as ws,
    ):
        root = ws.folder / "runs" / "toy"
        root.mkdir(parents=True)
        tasks = TASK_TOML.format(name=POISON_TASK, folder=write_poison_task(ws.folder / "tasks"))
        ws.write_config(
            [RunSpec("toy", root)],
            dataset=write_dataset(ws.folder / "arith.jsonl", 4),
            tasks=tasks,
            max_attempts=3,
        )
        ws.upgrade()
        checkpoints.toy_checkpoint()
        ws.start_daemon()
        written: dict[str, datetime] = {}
        steps = list(range(1, good + 2))
        try:
            # The poison and the first good checkpoint at the same moment (one discovery pass).
            write_poison_folders(root, ws.folder / "staging")
            for number, step in enumerate(steps):
                if number == len(steps) - 1:
                    # A restart with every poison item still there: it must start and go on.
                    wait_for(lambda: ws.jobs_settled(2 * len(written)), 600, "the good checkpoints so far")
                    assert ws.supervisor is not None
                    ws.fault("daemon restart (SIGTERM) with the poison present", "daemon.ready")
                    restart(ws.supervisor)
                checkpoints.write(root, step)
                written[f"step_{step}"] = datetime.now(UTC)
                time.sleep(2.0)
            wait_for(lambda: ws.jobs_settled(2 * len(steps)), 900, "every good checkpoint's jobs")
        except (TimeoutError, AssertionError) as exc:
            figures.notes.append(str(exc))
        figures.written = len(written)
        expected = Expected(due=frozenset(f"toy/{name}" for name in written), tasks=(TASK,))
        ws.finish(figures, expected)
        count_poison(figures, ws, root, written)
        return figures


def restart(supervisor: Supervisor) -> None:
    """SIGTERM the daemon as a planned fault; returns once the next one is ready (the old one says ready
    in its own log until it has gone, so the start is waited for first)."""
    before = supervisor.starts
    supervisor.kill(signal.SIGTERM)
    wait_for(lambda: supervisor.starts > before, 120, "the daemon to be started again")
    supervisor.wait_ready()


def count_poison(figures: Figures, ws: Workspace, root: Path, written: dict[str, datetime]) -> None:
    """The poison and lateness counters, from the database and the daemon's logs."""
    database = ws.database()
    try:
        with database.session() as session:
            rows = session.execute(select(Checkpoint.id, Checkpoint.name, Checkpoint.state)).all()
            jobs = session.execute(
                select(EvalJob.checkpoint_id, EvalJob.task, EvalJob.state, EvalJob.error, EvalJob.finished_at)
            ).all()
    finally:
        database.dispose()
    by_start = [path.read_text(encoding="utf-8", errors="replace").splitlines() for path in daemon_logs(ws)]
    names = {checkpoint_id: name for checkpoint_id, name, _ in rows}
    figures.poison = len(POISON_FOLDERS) + 1
    said = []
    for item in POISON_FOLDERS:
        states = [state for _, name, state in rows if name == item.name]
        item_jobs = [j for j in jobs if names.get(j.checkpoint_id) == item.name]
        refused = not item_jobs and all(state == CheckpointState.INVALID for state in states)
        per_start = [sum(1 for line in lines if item.pattern.search(line)) for lines in by_start]
        if not refused:
            figures.poison_unrefused += 1
        if sum(per_start) == 0 or max(per_start) > 1:
            figures.poison_misnamed += 1
        shown = ",".join(s.value for s in states) or "no row"
        said.append(f"{item.name} {shown}, {len(item_jobs)} job(s), named {'+'.join(map(str, per_start))}")
    boxed = [j for j in jobs if j.task == POISON_TASK]
    failed_naming_both = [
        j for j in boxed if j.state == JobState.FAILED and all(f in (j.error or "") for f in FILTERS)
    ]
    if not boxed or len(failed_naming_both) != len(boxed):
        figures.poison_unrefused += 1
    lines_naming_both = sum(1 for lines in by_start for line in lines if all(f in line for f in FILTERS))
    if not boxed or lines_naming_both != len(boxed):
        figures.poison_misnamed += 1
    said.append(
        f"task {POISON_TASK}: {len(failed_naming_both)} of {len(boxed)} job(s) failed naming both filters, "
        f"{lines_naming_both} log line(s) name both"
    )
    figures.notes.append("poison: " + "; ".join(said))
    # On time: each good checkpoint's arith result stored within ON_TIME_SECS of its write.
    waited = delays(written, jobs, names)
    figures.late += sum(1 for secs in waited.values() if secs > ON_TIME_SECS)
    shown = ", ".join(f"{name} {secs:.0f} s" for name, secs in waited.items())
    figures.notes.append(f"good checkpoints evaluated after: {shown or 'none'}")


def delays(written: dict[str, datetime], jobs: Sequence[Any], names: dict[int, str]) -> dict[str, float]:
    """Seconds from each good checkpoint's write to its stored ``TASK`` result, for those that have one."""
    waited = {}
    for name, at in written.items():
        done = [
            j.finished_at
            for j in jobs
            if names.get(j.checkpoint_id) == name and j.task == TASK and j.state == JobState.SUCCEEDED
        ]
        if done and done[0] is not None:
            finished = done[0] if done[0].tzinfo else done[0].replace(tzinfo=UTC)
            waited[name] = (finished - at).total_seconds()
    return waited


def daemon_logs(ws: Workspace) -> list[Path]:
    """One log per daemon start, in order."""
    logs = [p for p in ws.logs.glob("daemon-*.log") if os.path.isfile(p)]  # noqa: PTH113
    return sorted(logs, key=lambda p: int(p.stem.split("-")[1]))
