"""Slow writers for every layout: each layout's real checkpoint replayed into a watched root, slowly.

The checkpoints come from ``tests/cases`` (each built by the layout's real writer, or in its exact file
order cited from the trainer's source): HF ``save_pretrained`` (sharded, and ``.bin``), the HF Trainer's
``checkpoint-N`` (plain and under DeepSpeed ZeRO-3), DeepSpeed ``global_stepN`` (ZeRO 0–3), PyTorch DCP,
verl, AReaL and OpenRLHF (actor and ``_hf``). One daemon watches one run per layout (``layout = "auto"``)
while every writer at once appends its files in the trainer's order, large files in 2–5 pieces, with
random pauses up to 0.9 × ``quiet_secs``, trackers and markers last. A job that starts before its
writer's last write counts as ``read_early``; every checkpoint must then be evaluated once.
``--short`` takes the layouts whose writers run in-process (hf, hf_bin, areal, dcp, verl); the others
need 2-rank DeepSpeed/Trainer runs and take minutes to build.
"""

from __future__ import annotations

import importlib
import random
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from reliability.figures import Expected, Figures
from reliability.scenarios.base import Options
from reliability.workspace import TASK, RunSpec, wait_for, workspace, write_dataset
from storage.models import Checkpoint, EvalJob, Run

SHORT = ("hf", "hf_bin", "areal", "dcp", "verl")
FULL = (
    *SHORT,
    "hf_trainer",
    "hf_trainer_deepspeed",
    "deepspeed_zero0",
    "deepspeed_zero1",
    "deepspeed_zero2",
    "deepspeed_zero3",
    "openrlhf",
    "openrlhf_hf",
)
QUIET = 2.0


def replay(source: Path, target: Path, order: tuple[str, ...], rng: random.Random) -> datetime:
    """Write ``order`` from ``source`` into ``target``; returns the time of the last write."""
    for relpath in order:
        data = (source / relpath).read_bytes()
        pieces = rng.randint(2, 5) if len(data) > 4096 else 1
        size = max(1, -(-len(data) // pieces))
        destination = target / relpath
        destination.parent.mkdir(parents=True, exist_ok=True)
        with destination.open("wb") as out:
            for start in range(0, max(1, len(data)), size):
                out.write(data[start : start + size])
                out.flush()
                time.sleep(rng.uniform(0.0, QUIET * 0.9))
    return datetime.now(UTC)


def run(options: Options) -> Figures:
    names = options.pick(short=SHORT, full=FULL)
    figures = Figures("slow writers, every layout")
    with (
        workspace("slow-writers", options.workdir) as ws,
        tempfile.TemporaryDirectory(prefix="evald-cases-") as tmp,
    ):
        cases = {}
        for name in names:
            module = importlib.import_module(f"tests.cases.{name}")
            (Path(tmp) / name).mkdir()
            cases[name] = module.build(Path(tmp) / name)
        runs = []
        for name, case in cases.items():
            extra = f'hf_config = "{case.hf_config}"' if case.hf_config is not None else ""
            runs.append(RunSpec(name, ws.folder / "runs" / name, extra))
            (ws.folder / "runs" / name).mkdir(parents=True)
        ws.write_config(runs, dataset=write_dataset(ws.folder / "arith.jsonl", 4), quiet=QUIET)
        ws.upgrade()
        ws.start_daemon()
        finished: dict[str, datetime] = {}

        def write(name: str) -> None:
            case = cases[name]
            rng = random.Random(f"{options.seed}:{name}")
            finished[name] = replay(case.source, ws.folder / "runs" / name, case.order, rng)

        writers = [threading.Thread(target=write, args=(name,)) for name in cases]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join()
        try:
            wait_for(
                lambda: ws.jobs_settled(len(cases)), options.pick(short=600, full=1200), "every layout's job"
            )
        except TimeoutError as exc:
            figures.notes.append(str(exc))
        figures.written = len(cases)
        expected = Expected(due=frozenset(f"{n}/{c.candidate}" for n, c in cases.items()), tasks=(TASK,))
        database = ws.database()
        try:
            with database.session() as session:
                started = session.execute(
                    select(Run.name, EvalJob.started_at)
                    .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
                    .join(Run, Checkpoint.run_id == Run.id)
                ).all()
        finally:
            database.dispose()
        for run_name, at in started:
            if at is not None and run_name in finished and at < finished[run_name]:
                figures.read_early += 1
                figures.notes.append(
                    f"{run_name}: job started {at} before the last write {finished[run_name]}"
                )
        figures.notes.append("layouts: " + ", ".join(names))
        return ws.finish(figures, expected)
