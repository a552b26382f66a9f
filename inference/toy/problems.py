"""Two-operand addition problems for the toy model, and the held-out evaluation set.

The ``MAX_OPERAND + 1`` squared operand pairs are split once, deterministically, into a training part and a
held-out part (:data:`HELD_OUT_FRACTION`), so the trainer never sees a problem of the evaluation set and
the accuracy it reaches measures learnt addition, not recall.

The evaluation task must use :data:`PROMPT_TEMPLATE` (the model is trained on exactly that text) and
grade against the ``answer`` field; the model answers ``\\boxed{ANSWER}`` and then ``</s>``::

    python -m inference.toy.problems --out heldout.jsonl --n 100 --seed 1
    # {"id": "0", "problem": "23+45", "answer": "68"}
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Prompt template for :class:`inference.spec.TaskSpec`; the training text is ``23+45=\boxed{68}</s>``.
PROMPT_TEMPLATE = "{prompt}="
MAX_OPERAND = 99
HELD_OUT_FRACTION = 0.1
#: Fixed, so that every trainer and every evaluation set agree on the split.
_SPLIT_SEED = 20240601


@dataclass(frozen=True, order=True)
class Problem:
    a: int
    b: int

    @property
    def text(self) -> str:
        return f"{self.a}+{self.b}"

    @property
    def answer(self) -> str:
        return str(self.a + self.b)

    @property
    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(prompt=self.text)

    @property
    def target(self) -> str:
        """What the model is trained to write after the prompt (``</s>`` follows)."""
        return f"\\boxed{{{self.answer}}}"


@functools.cache
def _split() -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    pairs = [Problem(a, b) for a in range(MAX_OPERAND + 1) for b in range(MAX_OPERAND + 1)]
    random.Random(_SPLIT_SEED).shuffle(pairs)
    cut = round(len(pairs) * HELD_OUT_FRACTION)
    return tuple(sorted(pairs[cut:])), tuple(sorted(pairs[:cut]))


def training_problems() -> tuple[Problem, ...]:
    return _split()[0]


def held_out_problems(n: int, seed: int) -> list[Problem]:
    """``n`` distinct held-out problems, drawn reproducibly by ``seed``."""
    pool = _split()[1]
    if not 1 <= n <= len(pool):
        raise ValueError(f"n must be between 1 and {len(pool)}, got {n}")
    return random.Random(seed).sample(pool, n)


def write_jsonl(problems: Sequence[Problem], path: Path) -> None:
    lines = (
        json.dumps({"id": str(index), "problem": problem.text, "answer": problem.answer})
        for index, problem in enumerate(problems)
    )
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inference.toy.problems", description="Write a held-out toy evaluation set."
    )
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    parser.add_argument("--n", type=int, default=100, help="number of problems (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="which held-out problems to draw")
    args = parser.parse_args(argv)
    try:
        problems = held_out_problems(args.n, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    write_jsonl(problems, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
