"""A checkpoint deleted while its worker loads it (a trainer rotating old checkpoints away).

Each round writes a checkpoint, waits for its job to start, sleeps a random 0–2 s (the worker is
starting, importing or reading the weights) and deletes the folder. The job must end once: ``failed``
as ``checkpoint_vanished`` (the checkpoint marked ``vanished``, no alert paged), or ``succeeded`` if the
worker had already read everything; and the daemon must go on to evaluate the next checkpoint.
"""

from __future__ import annotations

import functools
import random
import shutil
import time

from sqlalchemy import select

from reliability import checkpoints
from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.workspace import TASK, RunSpec, Workspace, wait_for, workspace, write_dataset
from storage.models import Checkpoint, EvalJob, JobState


def run(options: Options) -> Figures:
    rounds = options.pick(short=2, full=5)
    figures = Figures("checkpoint deleted mid-load")
    rng = random.Random(options.seed)
    with workspace("deleted", options.workdir) as ws:
        root = ws.folder / "runs" / "toy"
        root.mkdir(parents=True)
        ws.write_config([RunSpec("toy", root)], dataset=write_dataset(ws.folder / "arith.jsonl", 4))
        ws.upgrade()
        checkpoints.toy_checkpoint()
        ws.start_daemon()
        deleted: list[str] = []
        step = 0
        try:
            for _ in range(rounds):
                step += 1
                folder = checkpoints.write(root, step)
                wait_for(
                    functools.partial(is_running, ws, folder.name),
                    300,
                    f"{folder.name} to start",
                )
                time.sleep(rng.uniform(0.0, 2.0))
                ws.fault("checkpoint deleted", "checkpoint.vanished", "job.failed")
                shutil.rmtree(folder)
                deleted.append(f"toy/{folder.name}")
                wait_for(functools.partial(ws.jobs_settled, step), 300, f"{folder.name}'s job to end")
            # The daemon goes on: a last checkpoint, left in place, is evaluated.
            step += 1
            checkpoints.write(root, step)
            wait_for(functools.partial(ws.jobs_settled, step), 300, "the last checkpoint")
        except TimeoutError as exc:
            figures.notes.append(str(exc))
        figures.written = step
        expected = Expected(
            due=frozenset(f"toy/step_{s}" for s in range(1, step + 1)),
            tasks=(TASK,),
            fail_ok=frozenset(deleted),
        )
        figures.notes.append(
            f"{len(deleted)} deleted mid-load: {outcomes(ws, [d.split('/', 1)[1] for d in deleted])}"
        )
        return ws.finish(figures, expected)


def is_running(ws: Workspace, name: str) -> bool:
    return job_state(ws, name) == JobState.RUNNING


def job_state(ws: Workspace, name: str) -> JobState | None:
    database = ws.database()
    try:
        with database.session() as session:
            return session.scalar(
                select(EvalJob.state)
                .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
                .where(Checkpoint.name == name)
            )
    finally:
        database.dispose()


def outcomes(ws: Workspace, names: list[str]) -> str:
    database = ws.database()
    try:
        with database.session() as session:
            rows = session.execute(
                select(Checkpoint.name, EvalJob.state, EvalJob.error_kind)
                .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
                .where(Checkpoint.name.in_(names))
            ).all()
    finally:
        database.dispose()
    return ", ".join(f"{name} {state.value}{f' ({kind})' if kind else ''}" for name, state, kind in rows)
