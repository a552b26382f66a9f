"""Two-operand addition problems for the toy model, and the held-out evaluation set.

The ``MAX_OPERAND + 1`` squared operand pairs are split once, deterministically, into a training part and a
held-out part (:data:`HELD_OUT_FRACTION`), so the trainer never sees a problem of the evaluation set and
the accuracy it reaches measures learnt addition, not recall.

The evaluation task must use :data:`PROMPT_TEMPLATE` (the model is trained on exactly that text) and
grade against the ``answer`` field; the model answers ``\\boxed{ANSWER}`` and then ``</s>``::

    python -m inference.toy.problems --out heldout.jsonl --n 100 --seed 1
    # {"id": "0", "problem": "23+45", "answer": "68"}
    python -m inference.toy.problems --out math500.jsonl --format math500
    # {"problem": "23+45", "solution": "23+45=\\boxed{68}", "answer": "68", "subject": "Arithmetic",
    #  "level": 4, "unique_id": "test/arithmetic/0.json"}

The files in ``inference/toy/data`` (:data:`SHIPPED`) are written by ``--shipped``.
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
    def level(self) -> int:
        """Difficulty 1–5, as MATH500 grades its problems: one step per two-digit operand and per carry."""
        carries = (self.a % 10 + self.b % 10 >= 10) + (self.a + self.b >= 100)
        return 1 + (self.a >= 10) + (self.b >= 10) + carries

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


def plain_row(problem: Problem, index: int) -> dict[str, object]:
    return {"id": str(index), "problem": problem.text, "answer": problem.answer}


def math500_row(problem: Problem, index: int) -> dict[str, object]:
    """The fields of MATH500 (and Qwen2.5-Math's evaluation files), which AReaL reads too."""
    return {
        "problem": problem.text,
        "solution": f"{problem.prompt}{problem.target}",
        "answer": problem.answer,
        "subject": "Arithmetic",
        "level": problem.level,
        "unique_id": f"test/arithmetic/{index}.json",
    }


def text_row(problem: Problem, index: int) -> dict[str, object]:
    """Held-out text for a likelihood task: what the trainer's text looks like, for problems it never saw."""
    return {"id": str(index), "text": f"{problem.prompt}{problem.target}"}


FORMATS = {"plain": plain_row, "math500": math500_row, "text": text_row}

#: The datasets shipped in ``inference/toy/data``, so the demo and tests run offline: file name →
#: (format, number of problems, seed). ``tests/test_toy.py`` checks the files are what this writes.
DATA_DIR = Path(__file__).parent / "data"
SHIPPED = {"arith500.jsonl": ("math500", 500, 0), "arith-text.jsonl": ("text", 200, 1)}


def write_jsonl(problems: Sequence[Problem], path: Path, format: str = "plain") -> None:
    row = FORMATS[format]
    lines = (json.dumps(row(problem, index)) for index, problem in enumerate(problems))
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_shipped(directory: Path = DATA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (format, n, seed) in SHIPPED.items():
        write_jsonl(held_out_problems(n, seed), directory / name, format)
        written.append(directory / name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inference.toy.problems", description="Write a held-out toy evaluation set."
    )
    parser.add_argument("--out", type=Path, help="JSONL file to write")
    parser.add_argument("--n", type=int, default=100, help="number of problems (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="which held-out problems to draw")
    parser.add_argument(
        "--format", choices=sorted(FORMATS), default="plain", help="row fields (default plain)"
    )
    parser.add_argument("--shipped", action="store_true", help=f"rewrite the datasets in {DATA_DIR}")
    args = parser.parse_args(argv)
    if args.shipped:
        write_shipped()
        return 0
    if args.out is None:
        parser.error("--out is required (or --shipped)")
    try:
        problems = held_out_problems(args.n, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    write_jsonl(problems, args.out, args.format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
