"""What judging the whole series in step order costs per stored result, against judging its newest step.

Since issue 31 every stored result re-judges its run's whole series (``daemon.anomaly.detector.judge``),
so that alerts are the same whatever order results arrive in. The baseline is what the daemon did before:
the detectors at the newest step only (``detect``). Both run in this process on the same synthetic series
(14 metrics with standard errors, as the demo's task stores), for several series lengths; the ratio says
what the step-order guarantee costs, the absolute time what a stored result waits for.

    python -m bench.judging [--metrics 14] [--lengths 50 200 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

from daemon.anomaly import Point, detect
from daemon.anomaly.detector import judge


def series(metrics: int, length: int, seed: int = 0) -> dict[str, list[Point]]:
    rng = random.Random(seed)
    return {
        f"metric_{m}": [Point(step * 10, 0.5 + rng.gauss(0, 0.03), 200, 0.035) for step in range(length)]
        for m in range(metrics)
    }


def timed(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=int, default=14)
    parser.add_argument("--lengths", type=int, nargs="+", default=[50, 200, 1000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| checkpoints in the series | newest step only (before) | whole series (now) | ratio |")
    print("|---|---|---|---|")
    for length in args.lengths:
        points = series(args.metrics, length)
        directions = dict.fromkeys(points, True)
        newest = timed(partial(detect, points, directions), args.repeats)
        whole = timed(partial(judge, points, directions), args.repeats)
        print(f"| {length} | {newest * 1000:.1f} ms | {whole * 1000:.1f} ms | {whole / newest:.1f}x |")


if __name__ == "__main__":
    main()
