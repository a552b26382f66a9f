"""Whether two runs differ at a checkpoint step, tested many times at once: pure functions.

**Paired test** where both runs were graded on the same prompts (the samples table holds each prompt's
grades). Per shared prompt ``p`` the score of each run is the mean over its completions of that prompt,
``d_p = b_p - a_p``, and over the ``m`` prompts::

    mean_d = sum(d_p) / m,   se = sd(d_p) / sqrt(m)   (sd with Bessel's correction),   z = mean_d / se

Prompts a model finds easy are easy for both runs: pairing removes that shared variance, which the
independent test counts twice (its verdicts are too timid when the runs are correlated). When every
``d_p`` is equal, ``se`` is 0: p = 1 if they are all 0, else the sign test's ``2 · 0.5**m``.

**Independent test** otherwise (different prompts, or a metric the samples cannot rebuild, such as
perplexity or entropy): ``z = (B - A) / sqrt(se_A² + se_B²)``.

Both take the two-sided normal p-value, ``erfc(|z| / sqrt 2)``.

**Benjamini–Hochberg** over every point tested: with ``m`` p-values sorted ``p_(1) <= … <= p_(m)``, the
adjusted value is ``min_{j >= i} min(1, m p_(j) / j)``; a point differs when its adjusted p-value is at
most the false discovery rate ``q``, so among the points called different, at most a share ``q`` is
expected to be noise, however many steps and metrics were compared.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

#: Default false discovery rate.
FDR = 0.05

TestKind = Literal["paired", "independent"]


@dataclass(frozen=True)
class Tested:
    kind: TestKind
    #: The difference tested, B - A (paired: the mean of the per-prompt differences).
    estimate: float
    #: Standard error of the difference the test used.
    stderr: float
    z: float
    p: float
    #: Prompts paired (None for the independent test).
    pairs: int | None = None


def two_sided_p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2.0))


def independent(a: float, b: float, stderr_a: float | None, stderr_b: float | None) -> Tested | None:
    """The z-test of ``b - a`` for two independent estimates; None without both errors or finite values,
    or when both errors are 0 (nothing to judge a difference against)."""
    if stderr_a is None or stderr_b is None or not all(map(math.isfinite, (a, b, stderr_a, stderr_b))):
        return None
    combined = math.hypot(stderr_a, stderr_b)
    if combined == 0:
        return None
    z = (b - a) / combined
    return Tested("independent", b - a, combined, z, two_sided_p(z))


def paired(scores_a: Mapping[str, Sequence[float]], scores_b: Mapping[str, Sequence[float]]) -> Tested | None:
    """The paired test over the prompts both score maps hold (prompt id → that prompt's sample scores);
    None with fewer than 2 shared prompts."""
    shared = sorted(set(scores_a) & set(scores_b))
    differences = [
        statistics.fmean(scores_b[p]) - statistics.fmean(scores_a[p])
        for p in shared
        if scores_a[p] and scores_b[p]
    ]
    m = len(differences)
    if m < 2 or not all(map(math.isfinite, differences)):
        return None
    mean = math.fsum(differences) / m
    stderr = statistics.stdev(differences) / math.sqrt(m)
    if stderr == 0:
        if mean == 0:
            return Tested("paired", mean, 0.0, 0.0, 1.0, m)
        return Tested("paired", mean, 0.0, math.copysign(math.inf, mean), min(1.0, 2.0 * 0.5**m), m)
    z = mean / stderr
    return Tested("paired", mean, stderr, z, two_sided_p(z), m)


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values, in the order given (module docstring)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, m * p_values[i] / rank)
        adjusted[i] = min(1.0, running)
    return adjusted
