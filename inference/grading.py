"""Answer grading with math-verify: is the model's final answer equal to the reference?

``grade`` never raises on what a model writes. math-verify bounds each parse and comparison with
``signal.alarm``, which only works in the main thread; elsewhere the bounds are dropped (the answers
graded here are short, and a worker runs grading in its main thread).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, NamedTuple

#: Seconds math-verify may spend on one parse or one comparison (main thread only).
TIMEOUT_S = 5

# math-verify warns once on the stdlib logger whenever its timeouts are off; that is our choice, not news.
logging.getLogger("math_verify").setLevel(logging.ERROR)


class Grade(NamedTuple):
    #: The final answer found in the response, as math-verify normalised it; ``None`` if none was found.
    extracted: str | None
    correct: bool


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    parsed: list[Any] = parse(
        text,
        extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
        parsing_timeout=_timeout(),
    )
    return parsed


def _as_text(parsed: list[Any]) -> str | None:
    # parse() returns [sympy value, matched string] when it succeeds; the string is what the model wrote.
    if not parsed:
        return None
    return str(parsed[-1]) if isinstance(parsed[-1], str) else str(parsed[0])


def grade(response: str, reference: str) -> Grade:
    """Grade ``response`` against a plain reference answer such as ``19`` or ``\\frac{1}{2}``."""
    from math_verify import verify

    try:
        predicted = _parse(response)
        # A bare answer is wrapped in $…$ so that the LaTeX extractor reads it as one expression.
        gold = _parse(reference if "$" in reference else f"${reference}$")
        if not predicted or not gold:
            return Grade(extracted=_as_text(predicted), correct=False)
        correct = bool(verify(gold, predicted, timeout_seconds=_timeout()))
    except Exception:
        # Garbage in a model's output is an answer that is wrong, never a failed job.
        return Grade(extracted=None, correct=False)
    return Grade(extracted=_as_text(predicted), correct=correct)
