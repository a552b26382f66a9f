"""Detector quality on a labelled synthetic benchmark: recall on injected anomalies, false alarms on clean.

Fixed-seed runs shaped like real RL evaluation curves: accuracy rising and saturating with binomial noise at
a realistic eval-set size (100, 200 or 500 items), response length drifting slowly, a small truncation rate,
policy entropy decaying slowly. Half the runs are clean; the other half get one injected anomaly from a
random onset: a cliff (accuracy falls 0.15–0.35 at once), a slow drift (accuracy losing 1.5–3 points per
checkpoint), a length explosion (length ×2–3 and truncation up, accuracy flat), an entropy collapse (entropy
to a tenth, accuracy stops improving).

The detectors (``daemon.anomaly.detect``) run after every checkpoint on the series so far, as the daemon
runs them when a result is stored. An alarm is a rule starting to fire on a metric (a rule that keeps
firing on the next checkpoints is the same alarm, as the alert lifecycle dedups it). Recall: anomalous runs
with an alarm within ``--horizon`` checkpoints of the onset. False alarms: alarm onsets on clean runs, per
clean run per 100 checkpoints. Targets: recall >= 0.9, false alarms <= 0.05.

    python -m bench.detector_quality [--runs 200] [--points 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from daemon.anomaly import Point, detect
from daemon.anomaly.settings import Settings
from inference.metrics.base import proportion_with_stderr

KINDS = ("cliff", "drift", "length_explosion", "entropy_collapse")
DIRECTIONS = {"accuracy": True, "response_length": None, "truncation_rate": False, "entropy": None}


@dataclass
class Run:
    kind: str | None
    onset: int | None
    series: dict[str, list[Point]] = field(default_factory=dict)


def _proportion(rng: random.Random, step: int, n: int, p: float) -> Point:
    """An eval set of ``n`` items graded with chance ``p``, aggregated as the metric registry does."""
    p = min(max(p, 0.0), 1.0)
    value = proportion_with_stderr("", [rng.random() < p for _ in range(n)])
    return Point(step, value.value, value.n, value.stderr)


def _mean(rng: random.Random, step: int, n: int, value: float, spread: float) -> Point:
    stderr = spread / math.sqrt(n)
    return Point(step, value + rng.gauss(0, stderr), n, stderr)


def make_run(rng: random.Random, points: int, kind: str | None) -> Run:
    n = rng.choice((100, 200, 500))
    p0, pmax, tau = rng.uniform(0.05, 0.3), rng.uniform(0.5, 0.85), rng.uniform(4, 15)
    length0, length_trend = rng.uniform(200, 800), rng.uniform(-0.2, 0.3)
    truncation = rng.uniform(0.005, 0.05)
    entropy0, entropy_tau, entropy_min = rng.uniform(0.3, 1.0), rng.uniform(15, 60), rng.uniform(0.05, 0.15)
    # At least 10 checkpoints after the onset: a slow drift needs a few to stand out of the noise.
    onset = rng.randint(points // 3, points - 10) if kind else None
    cliff, drift = rng.uniform(0.15, 0.35), rng.uniform(0.015, 0.03)
    blow_up, cut_to = rng.uniform(2.0, 3.0), rng.uniform(0.15, 0.4)
    run = Run(kind, onset)
    for name in DIRECTIONS:
        run.series[name] = []
    for t in range(points):
        step = (t + 1) * 100
        after = onset is not None and t >= onset
        accuracy = p0 + (pmax - p0) * (1 - math.exp(-t / tau))
        length = length0 * (1 + length_trend * t / points)
        cut = truncation
        entropy = entropy_min + entropy0 * math.exp(-t / entropy_tau)
        if after and onset is not None:
            since = t - onset
            frozen = p0 + (pmax - p0) * (1 - math.exp(-onset / tau))
            if kind == "cliff":
                accuracy -= cliff
            elif kind == "drift":
                accuracy -= drift * (since + 1)
            elif kind == "length_explosion":
                accuracy = frozen
                length *= 1 + (blow_up - 1) * min(1.0, (since + 1) / 3)
                cut = truncation + (cut_to - truncation) * min(1.0, (since + 1) / 3)
            elif kind == "entropy_collapse":
                accuracy = frozen
                entropy *= 0.1
        run.series["accuracy"].append(_proportion(rng, step, n, accuracy))
        run.series["response_length"].append(_mean(rng, step, n, length, 0.5 * length))
        run.series["truncation_rate"].append(_proportion(rng, step, n, cut))
        run.series["entropy"].append(_mean(rng, step, n, entropy, 0.3 * entropy))
    return run


Detector = Callable[[Mapping[str, Sequence[Point]]], set[tuple[str, str]]]


def evald_detector(settings: Settings) -> Detector:
    return lambda series: {(f.rule, f.metric) for f in detect(series, DIRECTIONS, settings)}


def naive_detector(series: Mapping[str, Sequence[Point]]) -> set[tuple[str, str]]:
    """The baseline: a metric with a direction moved the wrong way by more than 3 standard errors of the
    difference from the previous checkpoint (the quick stage's anomaly candidate rule)."""
    fired = set()
    for metric, points in series.items():
        better = DIRECTIONS[metric]
        if better is None or len(points) < 2:
            continue
        now, before = points[-1], points[-2]
        noise = math.hypot(now.stderr or 0.0, before.stderr or 0.0)
        change = now.value - before.value
        if (-change if better else change) > 3 * noise:
            fired.add(("naive", metric))
    return fired


def alarms(run: Run, detector: Detector) -> list[tuple[int, str, str]]:
    """(checkpoint index, rule, metric) where a rule starts firing on a metric."""
    firing: set[tuple[str, str]] = set()
    started: list[tuple[int, str, str]] = []
    length = len(run.series["accuracy"])
    for t in range(length):
        prefix = {name: points[: t + 1] for name, points in run.series.items()}
        now = detector(prefix)
        started.extend((t, rule, metric) for rule, metric in sorted(now - firing))
        firing = now
    return started


@dataclass(frozen=True)
class Quality:
    recall: float
    false_alarms_per_100: float
    by_kind: dict[str, float]
    mean_delay: float
    pre_onset_alarms: int


def evaluate(runs: Sequence[Run], detector: Detector, horizon: int) -> Quality:
    clean = [r for r in runs if r.kind is None]
    anomalous = [r for r in runs if r.kind is not None]
    false = 0
    points = 0
    for run in clean:
        false += len(alarms(run, detector))
        points += len(run.series["accuracy"])
    detected: dict[str, list[bool]] = {kind: [] for kind in KINDS}
    delays: list[int] = []
    early = 0
    for run in anomalous:
        assert run.onset is not None and run.kind is not None
        found = alarms(run, detector)
        early += sum(1 for t, _, _ in found if t < run.onset)
        hits = [t - run.onset for t, _, _ in found if run.onset <= t <= run.onset + horizon]
        detected[run.kind].append(bool(hits))
        if hits:
            delays.append(min(hits))
    flags = [hit for hits in detected.values() for hit in hits]
    return Quality(
        recall=sum(flags) / len(flags),
        false_alarms_per_100=false / len(clean) * 100 / (points / len(clean)),
        by_kind={kind: sum(hits) / len(hits) for kind, hits in detected.items() if hits},
        mean_delay=sum(delays) / len(delays) if delays else math.nan,
        pre_onset_alarms=early,
    )


def make_runs(count: int, points: int, seed: int) -> list[Run]:
    rng = random.Random(seed)
    kinds: list[str | None] = [None] * (count // 2) + [
        KINDS[i % len(KINDS)] for i in range(count - count // 2)
    ]
    return [make_run(rng, points, kind) for kind in kinds]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs, half of them clean (at least 100)")
    parser.add_argument("--points", type=int, default=40, help="checkpoints per run")
    parser.add_argument(
        "--horizon", type=int, default=10, help="checkpoints after the onset an alarm may take"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    runs = make_runs(args.runs, args.points, args.seed)
    started = time.perf_counter()
    quality = evaluate(runs, evald_detector(Settings()), args.horizon)
    elapsed = time.perf_counter() - started
    naive = evaluate(runs, naive_detector, args.horizon)
    clean = sum(r.kind is None for r in runs)
    anomalous = len(runs) - clean
    print(f"{len(runs)} runs ({clean} clean, {anomalous} with an anomaly), {args.points} checkpoints each")
    print(f"{'':28s} {'evald':>8s} {'naive':>8s}")
    print(f"{'recall (target >= 0.9)':28s} {quality.recall:8.3f} {naive.recall:8.3f}")
    for kind in KINDS:
        print(f"{'  ' + kind:28s} {quality.by_kind[kind]:8.3f} {naive.by_kind[kind]:8.3f}")
    false_alarms = (quality.false_alarms_per_100, naive.false_alarms_per_100)
    print(f"{'false alarms (target <= 0.05)':28s} {false_alarms[0]:8.3f} {false_alarms[1]:8.3f}")
    print(f"{'alarms before onsets':28s} {quality.pre_onset_alarms:8d} {naive.pre_onset_alarms:8d}")
    print(f"{'mean delay (checkpoints)':28s} {quality.mean_delay:8.2f} {naive.mean_delay:8.2f}")
    print(f"recall within {args.horizon} checkpoints of the onset; false alarms per clean run per 100 points")
    if quality.false_alarms_per_100 > 0:
        print(
            f"false alarms, naive / evald: {naive.false_alarms_per_100 / quality.false_alarms_per_100:.1f}x"
        )
    print(f"recall, evald / naive: {quality.recall / naive.recall:.2f}x")
    cost = elapsed / (len(runs) * args.points) * 1000
    print(f"detection cost: {cost:.2f} ms per checkpoint (all rules, all metrics)")


if __name__ == "__main__":
    main()
