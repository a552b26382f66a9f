"""``evald plot``: one metric's curves as a PNG, PDF or SVG (matplotlib, Agg backend: no display needed).

The format is the ``--out`` suffix's: PNG is a raster at 120 dpi; PDF and SVG are vector (for papers),
PDF with its fonts embedded as TrueType (Type 42, which journals accept and editors can retouch), both
without a creation date, so the same data writes the same file. Another suffix is refused, never
silently written as PNG.

What the chart shows, per curve (one per run × task × stage of the metric):

- the stored values as faint points and line, and, with smoothing, the smoothed curve drawn over them
  (TensorBoard's look); without smoothing the stored curve is drawn full;
- a band of ± one standard error around the drawn curve (the smoothed standard error when smoothed);
- the best checkpoint (by the metric's direction, from ``[alerts] directions`` or the metric registry)
  as a star on the stored value; a metric with no direction has no best;
- each alert on this metric at its step: firing as a red ``X``, resolved as a hollow grey circle, on the
  stored value there; an alert about the run's evaluation (no metric: a failed or stuck job) as a dotted
  vertical line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: never look for a display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from daemon.analysis.curves import Curve
from daemon.analysis.smoothing import NONE, Smoothing
from daemon.errors import EvaldError
from daemon.scheduling import stages
from storage.alerting import AlertRow

#: ``--out`` suffix → matplotlib's ``savefig`` format.
FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}
#: Per format: no timestamp in the file (reproducible bytes); PNG's default metadata holds none.
_METADATA: dict[str, dict[str, str | None]] = {
    "png": {},
    "pdf": {"CreationDate": None},
    "svg": {"Date": None},
}

FIRING_COLOUR = "#d62728"
RESOLVED_COLOUR = "#7f7f7f"


@dataclass(frozen=True)
class Plotted:
    path: Path
    curves: int
    points: int
    alerts: int
    best: tuple[tuple[str, int, float], ...]


def _label(curve: Curve, runs: int, tasks: int) -> str:
    parts = []
    if runs > 1 or tasks == 1:
        parts.append(curve.run)
    if tasks > 1:
        parts.append(curve.task)
    if curve.stage != stages.FULL:
        parts.append(curve.stage)
    return " / ".join(parts)


def _best(curve: Curve, better: bool | None) -> tuple[int, float] | None:
    finite = [p for p in curve.points if math.isfinite(p.value)]
    if better is None or not finite:
        return None
    top = max(finite, key=lambda p: p.value if better else -p.value)
    return top.step, top.value


class PlotFormatError(EvaldError):
    """An ``--out`` path whose suffix names no format ``evald plot`` writes."""


def plot_format(out: Path) -> str:
    """The format ``out``'s suffix names (png, pdf, svg), or :class:`PlotFormatError` listing them."""
    found = FORMATS.get(out.suffix.lower())
    if found is None:
        shown = out.suffix or "no suffix"
        raise PlotFormatError(
            f"{out}: cannot tell the format from {shown!r} (write one of: {', '.join(FORMATS)})"
        )
    return found


def render(
    curves: Sequence[Curve],
    alerts: Sequence[AlertRow],
    *,
    out: Path,
    direction: Callable[[str], bool | None],
    smoothing: Smoothing = NONE,
    title: str | None = None,
) -> Plotted:
    """Draw ``curves`` (one metric) with ``alerts`` of their runs, write them to ``out`` in the format its
    suffix names (:func:`plot_format`)."""
    kind = plot_format(out)
    runs = len({c.run for c in curves})
    tasks = len({c.task for c in curves})
    figure, axes = plt.subplots(figsize=(10, 5.5), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    points = 0
    marked = 0
    best_marks: list[tuple[str, int, float]] = []
    try:
        for number, curve in enumerate(curves):
            label = _label(curve, runs, tasks)
            points += len(curve.steps)
            best = _draw(axes, curve, colours[number % len(colours)], label, smoothing, direction)
            if best is not None:
                best_marks.append((label, best[0], best[1]))
        marked += _alerts(axes, curves, alerts, named=runs > 1)
        marked += _run_alerts(axes, curves, alerts, named=runs > 1)
        _legend_for_alerts(axes, alerts, curves)
        metric = ", ".join(sorted({c.metric for c in curves}))
        heading = title or f"{metric}: " + ", ".join(dict.fromkeys(c.run for c in curves))
        if smoothing.enabled:
            heading += f"  (smoothing {smoothing.spec}, band ±1 stderr)"
        else:
            heading += "  (band ±1 stderr)"
        axes.set_title(heading, fontsize=11)
        axes.set_xlabel("step")
        axes.set_ylabel(metric)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8, loc="best")
        figure.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        with plt.rc_context({"pdf.fonttype": 42, "svg.hashsalt": "evald"}):
            figure.savefig(out, format=kind, metadata=_METADATA[kind])
    finally:
        plt.close(figure)
    return Plotted(out, len(curves), points, marked, tuple(best_marks))


def _draw(
    axes: Axes,
    curve: Curve,
    colour: str,
    label: str,
    smoothing: Smoothing,
    direction: Callable[[str], bool | None],
) -> tuple[int, float] | None:
    """One curve: its points (faint under the smoothed line), its ±1 stderr band and its best step
    starred; returns that best (step, value), if any."""
    drawn = curve.smoothed(smoothing)
    steps = curve.steps
    if smoothing.enabled:
        axes.plot(steps, curve.values, color=colour, alpha=0.3, linewidth=1, marker=".", markersize=4)
    axes.plot(
        steps,
        drawn.values,
        color=colour,
        linewidth=2,
        marker=None if smoothing.enabled else "o",
        markersize=3,
        label=label,
    )
    low = [v - se if se is not None else math.nan for v, se in zip(drawn.values, drawn.stderrs, strict=True)]
    high = [v + se if se is not None else math.nan for v, se in zip(drawn.values, drawn.stderrs, strict=True)]
    axes.fill_between(steps, low, high, color=colour, alpha=0.18, linewidth=0)
    best = _best(curve, direction(curve.metric))
    if best is not None:
        axes.plot(
            [best[0]],
            [best[1]],
            marker="*",
            markersize=16,
            color=colour,
            markeredgecolor="black",
            linestyle="none",
            zorder=5,
            label=f"best {label}: step {best[0]} ({best[1]:.4g})",
        )
    return best


def _alerts(axes: Axes, curves: Sequence[Curve], alerts: Sequence[AlertRow], *, named: bool) -> int:
    """One marker per alert on a drawn metric, on the stored value at its step (the full stage's curve
    first: an alert does not say which stage it watched); a step with no finite value is a line."""
    ordered = sorted(curves, key=lambda c: c.stage != stages.FULL)
    count = 0
    for alert in alerts:
        if alert.metric is None or alert.step is None:
            continue
        mine = [
            c
            for c in ordered
            if (c.run, c.metric) == (alert.run, alert.metric) and alert.task in (None, c.task)
        ]
        if not mine:
            continue
        colour = FIRING_COLOUR if alert.state == "firing" else RESOLVED_COLOUR
        values = [p.value for c in mine for p in c.points if p.step == alert.step and math.isfinite(p.value)]
        count += 1
        if not values:
            # A NaN (the non_finite rule) has no place on the y-axis: mark the step itself.
            axes.axvline(alert.step, color=colour, alpha=0.6)
            continue
        y = values[0]
        if alert.state == "firing":
            axes.plot([alert.step], [y], marker="X", markersize=11, color=colour, linestyle="none", zorder=6)
        else:
            axes.plot(
                [alert.step],
                [y],
                marker="o",
                markersize=11,
                markerfacecolor="none",
                markeredgecolor=colour,
                markeredgewidth=2,
                linestyle="none",
                zorder=6,
            )
        axes.annotate(
            _note(alert, named), (alert.step, y), textcoords="offset points", xytext=(6, 6), fontsize=7
        )
    return count


def _run_alerts(axes: Axes, curves: Sequence[Curve], alerts: Sequence[AlertRow], *, named: bool) -> int:
    """A dotted line at the step of each alert about a plotted run's evaluation (no metric)."""
    places = {(c.run, c.task) for c in curves}
    runs = {c.run for c in curves}
    count = 0
    for alert in alerts:
        if alert.metric is not None or alert.step is None or alert.run not in runs:
            continue
        if alert.task is not None and (alert.run, alert.task) not in places:
            continue
        colour = FIRING_COLOUR if alert.state == "firing" else RESOLVED_COLOUR
        axes.axvline(alert.step, color=colour, linestyle=":", linewidth=1.5)
        axes.annotate(
            _note(alert, named),
            (alert.step, 1.0),
            xycoords=("data", "axes fraction"),
            textcoords="offset points",
            xytext=(3, -12),
            fontsize=7,
            color=colour,
        )
        count += 1
    return count


def _note(alert: AlertRow, named: bool) -> str:
    """An alert marker's caption: its rule, and its run where several runs share the chart."""
    return f"{alert.run}: {alert.rule}" if named else alert.rule


def _legend_for_alerts(axes: Axes, alerts: Sequence[AlertRow], curves: Sequence[Curve]) -> None:
    """Legend entries for the alert markers once, not once per marker."""
    runs = {c.run for c in curves}
    states = {a.state for a in alerts if a.run in runs}
    if "firing" in states:
        axes.plot([], [], marker="X", color=FIRING_COLOUR, linestyle="none", label="alert firing")
    if "resolved" in states:
        axes.plot(
            [],
            [],
            marker="o",
            markerfacecolor="none",
            markeredgecolor=RESOLVED_COLOUR,
            markeredgewidth=2,
            linestyle="none",
            label="alert resolved",
        )
