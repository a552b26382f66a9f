"""``evald export tensorboard``: a run's stored results as TensorBoard event files.

Written by torch's :class:`~torch.utils.tensorboard.SummaryWriter` (the writer people already use), one
scalar per (task, stage, metric), the checkpoint step as the x-axis and the time the job finished as the
wall time. Tags are ``task/metric`` for the full stage and ``task/stage/metric`` for another (a two-stage
task's quick subset), so a run's full-stage curves group by task in TensorBoard.

Beside the scalars, what a TensorBoard user reaches for:

- **stderr** as margin charts (the Custom Scalars tab): each metric with a standard error gets the
  scalars ``stderr_band/<tag>/lower`` and ``.../upper`` (value ∓ one stderr) and a ``Margin`` chart of
  value, lower and upper, grouped by task;
- **samples** as text (the Text tab), tag ``samples/<task>`` (``samples/<task>/<stage>``), one entry per
  evaluated step: a Markdown table of at most :data:`SAMPLES_PER_STEP` samples, wrong ones first, each
  field cut to :data:`FIELD_CHARS` characters, with how many were stored and the ``evald samples``
  command that lists them all;
- **alerts** as text, tag ``alerts``, one entry per step an alert fired at (its onset), all alerts of
  that step listed with rule, metric, severity, state and message.

A metric value that is not a number of samples (no value, or n = 0) is left out, never written as 0.

The files go to ``OUT/<run>/``, so several runs exported to one ``OUT`` show as separate runs under
``tensorboard --logdir OUT``. A second export would append duplicate points to the same run, so a folder
that already holds event files is refused unless ``replace`` is given (which removes only those files).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from daemon.analysis.curves import Curve, Point
from daemon.errors import EvaldError
from daemon.scheduling import stages
from storage.alerting import AlertRow
from storage.queries import JobSamples, SampleRow

log = structlog.get_logger("daemon.export")

EVENT_GLOB = "events.out.tfevents.*"
#: Samples shown per step and task (wrong ones first); ``evald samples`` lists every one.
SAMPLES_PER_STEP = 16
#: Characters kept of each sample field (prompt, response, extracted answer, reference).
FIELD_CHARS = 400
ALERTS_TAG = "alerts"


def tag(curve: Curve) -> str:
    if curve.stage == stages.FULL:
        return f"{curve.task}/{curve.metric}"
    return f"{curve.task}/{curve.stage}/{curve.metric}"


def run_folder(out: Path, run: str) -> Path:
    """``out/<run>``, the run's name made a safe single path component."""
    safe = re.sub(r"[^A-Za-z0-9._=-]", "_", run).lstrip(".") or "_"
    return out / safe


def band_tags(curve: Curve) -> tuple[str, str]:
    """The scalars holding value − stderr and value + stderr of ``curve``'s margin chart."""
    return f"stderr_band/{tag(curve)}/lower", f"stderr_band/{tag(curve)}/upper"


def samples_tag(task: str, stage: str) -> str:
    return f"samples/{task}" if stage == stages.FULL else f"samples/{task}/{stage}"


def _number(point: Point) -> bool:
    # A metric over zero samples has no value; one the other engineer's storage reads back as None.
    return point.value is not None and point.n != 0


@dataclass(frozen=True)
class Exported:
    folder: Path
    files: tuple[Path, ...]
    tags: int
    points: int
    #: Metrics written with a stderr margin chart.
    bands: int = 0
    #: Text entries: one per (task, stage, step) with samples, and one per step with alerts.
    sample_texts: int = 0
    alert_texts: int = 0


def _cell(text: str | None) -> str:
    """One Markdown table cell: cut, on one line, pipes and markup characters escaped."""
    if text is None:
        return "–"
    cut = text if len(text) <= FIELD_CHARS else text[:FIELD_CHARS] + f" … (+{len(text) - FIELD_CHARS} chars)"
    flat = " ⏎ ".join(cut.splitlines()) if ("\n" in cut or "\r" in cut) else cut
    return re.sub(r"([\\`*_{}\[\]<>|#])", r"\\\1", flat) or " "


def _graded(sample: SampleRow) -> str:
    if sample.error is not None:
        return "error"
    if sample.correct is None:
        return "not graded"  # a perplexity sample: a score, no right answer
    return "right" if sample.correct else "wrong"


def samples_markdown(found: JobSamples) -> str:
    """A step's samples as a Markdown table (wrong first, then errors, then right; at most
    :data:`SAMPLES_PER_STEP`), headed by what was stored and how to see the rest."""
    order = {"wrong": 0, "error": 1, "right": 2, "not graded": 3}
    chosen = sorted(found.samples, key=lambda s: (order[_graded(s)], s.index))[:SAMPLES_PER_STEP]
    wrong = sum(1 for s in found.samples if _graded(s) == "wrong")
    command = f"evald samples --run {found.run} --step {found.step} --task {found.task} --stage {found.stage}"
    lines = [
        f"**{found.task}** ({found.stage}) at step {found.step}, checkpoint `{found.checkpoint}`: "
        f"{len(chosen)} of {found.stored} stored sample(s) shown, {wrong} graded wrong "
        f"(wrong first); all of them: `{command}`",
        "",
        "| # | graded | reference | extracted | response | prompt |",
        "|---|---|---|---|---|---|",
    ]
    for sample in chosen:
        cells = (sample.reference, sample.extracted, sample.response, sample.prompt)
        lines.append(f"| {sample.index} | {_graded(sample)} | " + " | ".join(_cell(c) for c in cells) + " |")
    if found.problems:
        lines += ["", f"{len(found.problems)} input(s) left out of the metrics:"]
        lines += [f"- {_cell(p.where)}: {_cell(p.message)}" for p in found.problems[:SAMPLES_PER_STEP]]
    return "\n".join(lines)


def alerts_markdown(step: int | None, alerts: Sequence[AlertRow]) -> str:
    """The alerts that fired at ``step`` (their onset) as a Markdown list."""
    where = "no step (about the run's evaluation)" if step is None else f"step {step}"
    lines = [f"**{len(alerts)} alert(s)** first fired at {where}:", ""]
    for alert in alerts:
        last = getattr(alert, "last_step", None)
        seen = f", last seen at step {last}" if last is not None and last != step else ""
        metric = alert.metric or "(evaluation)"
        lines.append(
            f"- **{_cell(alert.rule)}** on {_cell(metric)} ({_cell(alert.task)}), {alert.severity}, "
            f"{alert.state}{seen}: {_cell(alert.message)}"
        )
    return "\n".join(lines)


def _text(writer: Any, name: str, markdown: str, step: int) -> None:
    from tensorboard.plugins.text.summary_v2 import text_pb  # type: ignore[import-untyped]

    # TensorBoard's own text summary (the tag kept as given; torch's add_text appends "/text_summary").
    writer.file_writer.add_summary(text_pb(name, markdown), global_step=step)


def write_events(
    curves: Sequence[Curve],
    *,
    run: str,
    out: Path,
    replace: bool = False,
    samples: Iterable[JobSamples] = (),
    alerts: Sequence[AlertRow] = (),
) -> Exported:
    """Write ``curves`` (all of run ``run``), the stderr bands, ``samples`` (one item per job) and
    ``alerts`` to ``out/<run>/`` (module docstring)."""
    from torch.utils.tensorboard import SummaryWriter  # torch is slow to import: only when exporting

    folder = _empty_folder(out, run, replace=replace)
    points = 0
    layout: dict[str, dict[str, list[Any]]] = {}
    sample_texts = alert_texts = 0
    writer = SummaryWriter(log_dir=str(folder))
    try:
        for curve in curves:
            name = tag(curve)
            lower, upper = band_tags(curve)
            written, banded = _write_curve(writer, curve)
            points += written
            if banded:
                charts = layout.setdefault(f"{curve.task} (value ± 1 stderr)", {})
                charts[name.removeprefix(f"{curve.task}/")] = ["Margin", [name, lower, upper]]
        if layout:
            writer.add_custom_scalars(layout)
        for found in samples:
            _text(writer, samples_tag(found.task, found.stage), samples_markdown(found), found.step)
            sample_texts += 1
        by_step: dict[int | None, list[AlertRow]] = {}
        for alert in alerts:
            by_step.setdefault(alert.step, []).append(alert)
        for step, found_alerts in sorted(
            by_step.items(), key=lambda item: -1 if item[0] is None else item[0]
        ):
            _text(writer, ALERTS_TAG, alerts_markdown(step, found_alerts), 0 if step is None else step)
            alert_texts += 1
        writer.flush()
    finally:
        writer.close()
    files = tuple(sorted(folder.glob(EVENT_GLOB)))
    bands = sum(len(charts) for charts in layout.values())
    log.info(
        "export.tensorboard",
        run=run,
        folder=str(folder),
        tags=len(curves),
        points=points,
        bands=bands,
        sample_texts=sample_texts,
        alert_texts=alert_texts,
    )
    return Exported(folder, files, len(curves), points, bands, sample_texts, alert_texts)


def _empty_folder(out: Path, run: str, *, replace: bool) -> Path:
    """The run's folder under ``out``, made; event files already there are refused, or removed with
    ``replace`` (a second export would duplicate every point)."""
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
    return folder


def _write_curve(writer: Any, curve: Curve) -> tuple[int, bool]:
    """``curve``'s finite points as scalars, with their ±1 stderr band where known: (points written,
    whether any had a band)."""
    name = tag(curve)
    lower, upper = band_tags(curve)
    points, banded = 0, False
    for point in curve.points:
        if not _number(point):
            continue
        walltime = None if point.evaluated_at is None else point.evaluated_at.timestamp()
        writer.add_scalar(name, point.value, global_step=point.step, walltime=walltime)
        points += 1
        if point.stderr is not None and point.stderr == point.stderr:
            writer.add_scalar(lower, point.value - point.stderr, global_step=point.step, walltime=walltime)
            writer.add_scalar(upper, point.value + point.stderr, global_step=point.step, walltime=walltime)
            banded = True
    return points, banded
