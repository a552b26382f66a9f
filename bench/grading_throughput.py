"""Grading throughput: ``inference.grading.grade`` against plain math-verify, in one process.

Two fixed-seed sets of (response, reference) pairs, shaped like a job's samples:

- ``toy``: the toy model's answers to ``--responses`` held-out addition problems (one greedy sample
  each, as its evaluation runs): about 60% the right ``\\boxed{N}``, 30% a wrong number in the box,
  10% text with no answer math-verify can read (a cut-off box, stray digits and braces);
- ``math``: ``--math-responses`` MATH500-style answers, 4 samples per item, after a few sentences of
  working in ``$…$``: about 30% the reference written the same way, 30% an equivalent form (``0.5``
  for ``\\frac{1}{2}``, ``\\sqrt{117}`` for ``3\\sqrt{13}``, ``x \\le 3`` for an interval), 30% a near
  miss, 10% no answer.

Three graders run on each, alternating, ``--repeats`` times (medians reported):

- ``evald``: ``grade`` as a job calls it; its cache of parsed references is emptied before every pass,
  so each pass pays for its references like a fresh job;
- ``evald_full``: ``grade(..., shortcut=False)``, i.e. without the text-equality shortcut;
- ``math_verify``: ``verify(parse(f"${reference}$"), parse(response))``, the way math-verify's README
  calls it: the baseline.

    python -m bench.grading_throughput [--responses 1000] [--math-responses 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence

Pairs = list[tuple[str, str]]

# (reference as MATH500 writes it, equivalent forms, near misses).
MATH_BANK: list[tuple[str, list[str], list[str]]] = [
    (r"\frac{1}{2}", [r"0.5", r"\dfrac{1}{2}", r"\frac{2}{4}"], [r"\frac{1}{3}", r"2", r"0.25"]),
    (r"3\sqrt{13}", [r"\sqrt{117}"], [r"3\sqrt{11}", r"13\sqrt{3}"]),
    (r"2\sqrt{2}", [r"\sqrt{8}", r"\frac{4}{\sqrt{2}}"], [r"2\sqrt{3}", r"\sqrt{2}"]),
    (r"(-\infty, 3]", [r"(-\infty,3]", r"x \le 3"], [r"(-\infty, 3)", r"[3, \infty)"]),
    (r"[2,5)", [r"[2, 5)"], [r"[2, 5]", r"(2, 5)"]),
    (r"\{1, 2, 3\}", [r"\{3,2,1\}", r"1, 2, 3"], [r"\{1, 2\}", r"\{1, 2, 3, 4\}"]),
    (r"10\%", [r"10", r"10 \%"], [r"11\%", r"1\%"]),
    (r"30^\circ", [r"30", r"30^{\circ}"], [r"60^\circ", r"150^\circ"]),
    (r"x^2+2x+1", [r"(x+1)^2", r"x^2 + 2x + 1"], [r"(x-1)^2", r"x^2+x+1"]),
    (r"1,\!000", [r"1000", r"1,000"], [r"100", r"10,000"]),
    (r"-\frac{1}{3}", [r"-\dfrac{1}{3}", r"\frac{-1}{3}"], [r"\frac{1}{3}", r"-3"]),
    (r"2\pi", [r"2 \pi", r"\pi \cdot 2"], [r"\pi", r"6.28"]),
    (r"\text{(C)}", [r"C", r"\textbf{(C)}"], [r"\text{(B)}", r"(D)"]),
    (
        r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",
        [r"\begin{pmatrix}1\\2\end{pmatrix}"],
        [r"\begin{pmatrix} 2 \\ 1 \end{pmatrix}"],
    ),
    (r"6 - 5i", [r"6-5i", r"-5i + 6"], [r"6+5i", r"5 - 6i"]),
    (r"\$18.90", [r"18.90", r"\$18.9"], [r"\$19.80", r"1.89"]),
    (r"68", [r"68.0", r"068"], [r"67", r"-68"]),
    (r"\frac{14}{3}", [r"4\frac{2}{3}", r"\dfrac{14}{3}"], [r"\frac{3}{14}", r"4\frac{1}{3}"]),
]


def toy_pairs(count: int, seed: int) -> Pairs:
    from inference.toy.problems import held_out_problems

    rng = random.Random(seed)
    problems = held_out_problems(min(count, 1000), seed)  # the held-out set has 1,000
    pairs: Pairs = []
    for index in range(count):
        answer = int(problems[index % len(problems)].answer)
        draw = rng.random()
        if draw < 0.6:
            response = f"\\boxed{{{answer}}}"
        elif draw < 0.9:
            response = f"\\boxed{{{answer + rng.choice([-10, -2, -1, 1, 2, 10])}}}"
        else:
            junk = "".join(rng.choice("0123456789+={}") for _ in range(rng.randint(1, 12)))
            response = rng.choice([f"\\boxed{{{answer}", f"\\boxed{junk}", f"}}{junk}", "\\boxed{}", "\\box"])
        pairs.append((response, str(answer)))
    return pairs


def _working(rng: random.Random) -> str:
    steps = []
    for _ in range(rng.randint(2, 6)):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        steps.append(
            f"Since $a = {a}$ and $b = {b}$, we get $a^2 + b^2 = {a * a + b * b}$ and $ab = {a * b}$."
        )
    return " ".join(steps)


def math_pairs(count: int, seed: int) -> Pairs:
    rng = random.Random(seed)
    pairs: Pairs = []
    for index in range(count):
        reference, equivalent, wrong = MATH_BANK[index // 4 % len(MATH_BANK)]
        draw = rng.random()
        if draw < 0.9:
            answer = reference if draw < 0.3 else rng.choice(equivalent if draw < 0.6 else wrong)
            response = f"{_working(rng)} Therefore the answer is $\\boxed{{{answer}}}$."
        else:
            response = _working(rng) + " I cannot finish this one."
        pairs.append((response, reference))
    return pairs


def run_evald(pairs: Pairs) -> int:
    from inference.grading import _reference, grade

    _reference.cache_clear()
    return sum(grade(response, reference).correct for response, reference in pairs)


def run_evald_full(pairs: Pairs) -> int:
    from inference.grading import _reference, grade

    _reference.cache_clear()
    return sum(grade(response, reference, shortcut=False).correct for response, reference in pairs)


def run_math_verify(pairs: Pairs) -> int:
    from math_verify import parse, verify

    return sum(bool(verify(parse(f"${reference}$"), parse(response))) for response, reference in pairs)


Runner = Callable[[Pairs], int]
METHODS: dict[str, Runner] = {
    "evald": run_evald,
    "evald_full": run_evald_full,
    "math_verify": run_math_verify,
}


def measure(name: str, pairs: Pairs, repeats: int) -> None:
    for warm_up in METHODS.values():
        warm_up(pairs[:20])  # imports, compiled patterns
    rates: dict[str, list[float]] = {method: [] for method in METHODS}
    right: dict[str, int] = {}
    for _ in range(repeats):
        for method, run in METHODS.items():
            started = time.perf_counter()
            right[method] = run(pairs)
            rates[method].append(len(pairs) / (time.perf_counter() - started))
    medians = {method: statistics.median(values) for method, values in rates.items()}
    print(f"{name}: {len(pairs)} responses, median of {repeats}")
    for method, rate in medians.items():
        print(
            f"  {method:<12} {rate:9.1f} responses/s  {1000 / rate:7.3f} ms/response"
            f"  ({right[method]} graded right)"
        )
    print(f"  ratio evald / math_verify: {medians['evald'] / medians['math_verify']:.2f}x")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=1000, help="toy-model responses")
    parser.add_argument("--math-responses", type=int, default=300, help="MATH-style responses; 0 skips")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import logging

    # Plain math-verify logs a warning per timed-out or failed parse; the comparison is about time.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    measure("toy", toy_pairs(args.responses, args.seed), args.repeats)
    if args.math_responses:
        measure("math", math_pairs(args.math_responses, args.seed), args.repeats)


if __name__ == "__main__":
    main()
