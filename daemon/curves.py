"""Metric curves: stored result rows as one series per (run, task, stage, metric), and two runs compared.

Pure functions over :class:`storage.queries.ResultRow` lists, shared by ``evald compare``, ``evald plot``
and ``evald export tensorboard``. A curve's x-axis is the checkpoint step; rows of a checkpoint without a
step (nothing to place on the axis) are left out.

Comparing run A with run B: each curve is smoothed over all its points first (so a matched step's smoothed
value is what a chart of that run shows there), then the two are matched on equal steps. The difference is
``B - A``; it *exceeds the noise* when ``|B - A| > k * sqrt(se_A**2 + se_B**2)``, the combined standard
error of two independent estimates, with ``k`` (default 2, about a 95% two-sided level) stated in every
rendering. Smoothed values carry smoothed standard errors (:mod:`daemon.smoothing`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from daemon.smoothing import NONE, Smoothing
from storage.queries import ResultRow

#: Default multiple of the combined standard error a difference must exceed.
SIGMAS = 2.0


@dataclass(frozen=True)
class Point:
    step: int
    value: float
    stderr: float | None
    n: int | None
    checkpoint: str
    evaluated_at: datetime | None = None


@dataclass(frozen=True)
class Curve:
    run: str
    task: str
    stage: str
    metric: str
    points: tuple[Point, ...]

    @property
    def steps(self) -> list[int]:
        return [p.step for p in self.points]

    @property
    def values(self) -> list[float]:
        return [p.value for p in self.points]

    @property
    def stderrs(self) -> list[float | None]:
        return [p.stderr for p in self.points]

    def smoothed(self, smoothing: Smoothing) -> Curve:
        """The same points with smoothed values and standard errors (``none`` returns ``self``)."""
        if not smoothing.enabled:
            return self
        values = smoothing.apply(self.values)
        stderrs = smoothing.apply_stderr(self.values, self.stderrs)
        points = tuple(
            replace(p, value=v, stderr=se) for p, v, se in zip(self.points, values, stderrs, strict=True)
        )
        return Curve(self.run, self.task, self.stage, self.metric, points)


def curves(rows: Iterable[ResultRow]) -> list[Curve]:
    """One curve per (run, task, stage, metric), points by step; in the rows' first-seen order."""
    grouped: dict[tuple[str, str, str, str], list[Point]] = {}
    for row in rows:
        if row.step is None:
            continue
        grouped.setdefault((row.run, row.task, row.stage, row.metric), []).append(
            Point(row.step, row.value, row.stderr, row.n, row.checkpoint, row.evaluated_at)
        )
    return [
        Curve(run, task, stage, metric, tuple(sorted(points, key=lambda p: p.step)))
        for (run, task, stage, metric), points in grouped.items()
    ]


@dataclass(frozen=True)
class Difference:
    task: str
    stage: str
    metric: str
    step: int
    a: float
    b: float
    stderr_a: float | None
    stderr_b: float | None

    @property
    def diff(self) -> float:
        return self.b - self.a

    @property
    def combined_stderr(self) -> float | None:
        if self.stderr_a is None or self.stderr_b is None:
            return None
        return math.hypot(self.stderr_a, self.stderr_b)

    def exceeds(self, sigmas: float) -> bool | None:
        """Whether ``|B - A|`` is beyond ``sigmas`` combined standard errors; None when one is unknown
        or a value is not finite."""
        combined = self.combined_stderr
        if combined is None or not (math.isfinite(self.a) and math.isfinite(self.b)):
            return None
        return abs(self.diff) > sigmas * combined


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    smoothing: Smoothing
    sigmas: float
    differences: tuple[Difference, ...]
    #: (task, stage, metric) series found in only one of the runs, or with no step in common.
    unmatched: tuple[str, ...]


def compare(
    a: Sequence[Curve],
    b: Sequence[Curve],
    *,
    run_a: str,
    run_b: str,
    smoothing: Smoothing = NONE,
    sigmas: float = SIGMAS,
) -> Comparison:
    """Both runs' curves, smoothed, at the steps both evaluated (module docstring)."""
    by_key_b = {(c.task, c.stage, c.metric): c.smoothed(smoothing) for c in b}
    differences: list[Difference] = []
    unmatched: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for curve_a in sorted(a, key=lambda c: (c.task, c.stage, c.metric)):
        key = (curve_a.task, curve_a.stage, curve_a.metric)
        seen.add(key)
        curve_b = by_key_b.get(key)
        if curve_b is None:
            unmatched.append(f"{'/'.join(key)} only in {run_a}")
            continue
        points_b = {p.step: p for p in curve_b.points}
        found = [
            Difference(*key, p.step, p.value, points_b[p.step].value, p.stderr, points_b[p.step].stderr)
            for p in curve_a.smoothed(smoothing).points
            if p.step in points_b
        ]
        if not found:
            unmatched.append(f"{'/'.join(key)}: no step in common")
        differences.extend(found)
    unmatched.extend(f"{'/'.join(k)} only in {run_b}" for k in sorted(by_key_b) if k not in seen)
    return Comparison(run_a, run_b, smoothing, sigmas, tuple(differences), tuple(unmatched))
