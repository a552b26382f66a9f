"""``evald export tensorboard``: a run's stored results as TensorBoard event files.

Written by torch's :class:`~torch.utils.tensorboard.SummaryWriter` (the writer people already use), one
scalar per (task, stage, metric), the checkpoint step as the x-axis and the time the job finished as the
wall time. Tags are ``task/metric`` for the full stage and ``task/stage/metric`` for another (a two-stage
task's quick subset), so a run's full-stage curves group by task in TensorBoard.

The files go to ``OUT/<run>/``, so several runs exported to one ``OUT`` show as separate runs under
``tensorboard --logdir OUT``. A second export would append duplicate points to the same run, so a folder
that already holds event files is refused unless ``replace`` is given (which removes only those files).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from daemon.curves import Curve
from daemon.errors import EvaldError
from daemon.scheduling import stages

log = structlog.get_logger("daemon.export")

EVENT_GLOB = "events.out.tfevents.*"


def tag(curve: Curve) -> str:
    if curve.stage == stages.FULL:
        return f"{curve.task}/{curve.metric}"
    return f"{curve.task}/{curve.stage}/{curve.metric}"


def run_folder(out: Path, run: str) -> Path:
    """``out/<run>``, the run's name made a safe single path component."""
    safe = re.sub(r"[^A-Za-z0-9._=-]", "_", run).lstrip(".") or "_"
    return out / safe


@dataclass(frozen=True)
class Exported:
    folder: Path
    files: tuple[Path, ...]
    tags: int
    points: int


def write_events(curves: Sequence[Curve], *, run: str, out: Path, replace: bool = False) -> Exported:
    """Write ``curves`` (all of run ``run``) to ``out/<run>/`` (module docstring)."""
    from torch.utils.tensorboard import SummaryWriter  # torch is slow to import: only when exporting

    folder = run_folder(out, run)
    if folder.exists() and not folder.is_dir():
        raise EvaldError(f"{folder}: exists and is not a folder")
    old = sorted(folder.glob(EVENT_GLOB)) if folder.is_dir() else []
    if old and not replace:
        raise EvaldError(
            f"{folder}: already holds {len(old)} TensorBoard event file(s) (a second export would duplicate "
            "every point); pass --replace to remove them first, or choose another --out"
        )
    for path in old:
        path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    points = 0
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for curve in curves:
            name = tag(curve)
            for point in curve.points:
                writer.add_scalar(
                    name,
                    point.value,
                    global_step=point.step,
                    walltime=None if point.evaluated_at is None else point.evaluated_at.timestamp(),
                )
                points += 1
        writer.flush()
    finally:
        writer.close()
    files = tuple(sorted(folder.glob(EVENT_GLOB)))
    log.info("export.tensorboard", run=run, folder=str(folder), tags=len(curves), points=points)
    return Exported(folder, files, len(curves), points)
