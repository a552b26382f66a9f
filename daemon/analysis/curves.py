"""Metric curves: stored result rows as one series per (run, task, stage, metric), and two runs compared.

Pure functions over :class:`storage.queries.ResultRow` lists, shared by ``evald compare``, ``evald plot``
and ``evald export tensorboard``. A curve's x-axis is the checkpoint step; rows of a checkpoint without a
step (nothing to place on the axis) are left out.

Comparing run A with run B: the two are matched on equal steps and every matched point is tested on its
raw values (:mod:`daemon.analysis.significance`): paired, prompt by prompt, where both runs stored every
graded sample of the same prompts and the metric is rebuilt from them (``PAIRED_SCORES``); otherwise as
two independent estimates. The difference is ``B - A``. The points tested are many (every step of every
metric), so the verdict controls the false discovery rate over all of them (Benjamini–Hochberg at ``fdr``,
default 5%): a point *differs* when its adjusted p-value is at most ``fdr``. Smoothing (``--smooth``)
only adds the smoothed values a chart shows beside the raw ones: it never enters a test (a smoothed
error is narrower than the point's own noise, and would change verdicts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from daemon.analysis import significance
from daemon.analysis.significance import Tested
from daemon.analysis.smoothing import NONE, Smoothing
from storage.queries import ResultRow
from storage.queries.grades import Grade, Key

#: Default false discovery rate of ``evald compare``.
FDR = significance.FDR

#: Metrics a job's stored samples rebuild (the mean of these per-sample scores): the ones a paired test
#: can take prompt by prompt.
PAIRED_SCORES: Mapping[str, Callable[[Grade], float | None]] = {
    "accuracy": lambda g: None if g.correct is None else float(g.correct),
    "truncation_rate": lambda g: float(g.truncated),
    "response_length": lambda g: float(g.tokens),
    "reward": lambda g: g.reward,
}

#: Grades of one run: (task, stage, step) → job id → its counted samples.
Grades = Mapping[Key, Mapping[int, Sequence[Grade]]]


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
    #: The test of this point (None: no verdict, see ``why``).
    test: Tested | None = None
    #: Why the test is not paired (or why there is none); None for a paired test.
    why: str | None = None
    #: Benjamini–Hochberg adjusted p-value over every point of the comparison.
    p_adjusted: float | None = None
    #: The smoothed values a chart shows here (display only; None without smoothing).
    smoothed_a: float | None = None
    smoothed_b: float | None = None

    @property
    def diff(self) -> float:
        return self.b - self.a

    @property
    def combined_stderr(self) -> float | None:
        if self.stderr_a is None or self.stderr_b is None:
            return None
        return math.hypot(self.stderr_a, self.stderr_b)

    def differs(self, fdr: float) -> bool | None:
        """Whether B and A differ here at false discovery rate ``fdr``; None without a test."""
        return None if self.p_adjusted is None else self.p_adjusted <= fdr


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    smoothing: Smoothing
    fdr: float
    differences: tuple[Difference, ...]
    #: (task, stage, metric) series found in only one of the runs, or with no step in common.
    unmatched: tuple[str, ...]

    @property
    def tested(self) -> int:
        return sum(1 for d in self.differences if d.test is not None)

    @property
    def paired(self) -> int:
        return sum(1 for d in self.differences if d.test is not None and d.test.kind == "paired")

    @property
    def different(self) -> int:
        return sum(1 for d in self.differences if d.differs(self.fdr))


def prompt_scores(
    jobs: Mapping[int, Sequence[Grade]] | None, metric: str, point: Point
) -> dict[str, list[float]] | str:
    """The point's per-prompt sample scores, or why the stored samples cannot give them: they must be
    every sample the job counted (``n``) and rebuild the stored value (``max_samples`` keeps only the
    first ones and the failed ones: a subset would be a biased pairing)."""
    score = PAIRED_SCORES.get(metric)
    if score is None:
        return f"{metric} is not rebuilt from samples"
    found: list[dict[str, list[float]]] = []
    for grades in (jobs or {}).values():
        scores = [(g.prompt_id, score(g)) for g in grades]
        kept = [(prompt, value) for prompt, value in scores if value is not None]
        if not kept or len(kept) != point.n:
            continue
        mean = math.fsum(value for _, value in kept) / len(kept)
        if not math.isclose(mean, point.value, rel_tol=1e-9, abs_tol=1e-9):
            continue
        by_prompt: dict[str, list[float]] = {}
        for prompt, value in kept:
            by_prompt.setdefault(prompt, []).append(value)
        found.append(by_prompt)
    if not jobs:
        return "no samples stored"
    if len(found) != 1:
        return "stored samples are not all of the job's" if not found else "two jobs fit the stored value"
    return found[0]


def judge(
    metric: str,
    a: Point,
    b: Point,
    jobs_a: Mapping[int, Sequence[Grade]] | None,
    jobs_b: Mapping[int, Sequence[Grade]] | None,
) -> tuple[Tested | None, str | None]:
    """The paired test where it holds, else the independent one, with why it is not paired."""
    scores_a, scores_b = prompt_scores(jobs_a, metric, a), prompt_scores(jobs_b, metric, b)
    why: str | None
    if isinstance(scores_a, str) or isinstance(scores_b, str):
        why = scores_a if isinstance(scores_a, str) else str(scores_b)
    elif set(scores_a) != set(scores_b):
        why = "the runs' prompts differ"
    elif any(len(scores_a[p]) != len(scores_b[p]) for p in scores_a):
        why = "completions per prompt differ"
    else:
        tested = significance.paired(scores_a, scores_b)
        # Per-prompt means weigh prompts equally; the stored values weigh samples: they agree when every
        # prompt kept all its completions, and only then does the test speak of the difference shown.
        if tested is not None and math.isclose(tested.estimate, b.value - a.value, abs_tol=1e-9):
            return tested, None
        why = "fewer than 2 prompts" if tested is None else "prompts kept different numbers of samples"
    found = significance.independent(a.value, b.value, a.stderr, b.stderr)
    if found is None:
        why = "no standard error" if a.stderr is None or b.stderr is None else "not finite or no noise"
    return found, why


def compare(
    a: Sequence[Curve],
    b: Sequence[Curve],
    *,
    run_a: str,
    run_b: str,
    smoothing: Smoothing = NONE,
    fdr: float = FDR,
    grades_a: Grades | None = None,
    grades_b: Grades | None = None,
) -> Comparison:
    """Both runs' curves at the steps both evaluated, each point tested, the verdicts at ``fdr`` over
    all of them (module docstring)."""
    by_key_b = {(c.task, c.stage, c.metric): c for c in b}
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
        shown_a = _display(curve_a, smoothing)
        shown_b = _display(curve_b, smoothing)
        points_b = {p.step: p for p in curve_b.points}
        found = []
        for p in curve_a.points:
            q = points_b.get(p.step)
            if q is None:
                continue
            where = (curve_a.task, curve_a.stage, p.step)
            tested, why = judge(
                curve_a.metric, p, q, (grades_a or {}).get(where), (grades_b or {}).get(where)
            )
            found.append(
                Difference(
                    *key,
                    p.step,
                    p.value,
                    q.value,
                    p.stderr,
                    q.stderr,
                    tested,
                    why,
                    smoothed_a=shown_a.get(p.step),
                    smoothed_b=shown_b.get(p.step),
                )
            )
        if not found:
            unmatched.append(f"{'/'.join(key)}: no step in common")
        differences.extend(found)
    unmatched.extend(f"{'/'.join(k)} only in {run_b}" for k in sorted(by_key_b) if k not in seen)
    judged = [(i, d.test.p) for i, d in enumerate(differences) if d.test is not None]
    adjusted = significance.benjamini_hochberg([p for _, p in judged])
    for (i, _), p_adjusted in zip(judged, adjusted, strict=True):
        differences[i] = replace(differences[i], p_adjusted=p_adjusted)
    return Comparison(run_a, run_b, smoothing, fdr, tuple(differences), tuple(unmatched))


def _display(curve: Curve, smoothing: Smoothing) -> dict[int, float]:
    """The smoothed value at each step, for display beside the raw one (empty without smoothing)."""
    if not smoothing.enabled:
        return {}
    return {p.step: p.value for p in curve.smoothed(smoothing).points}
