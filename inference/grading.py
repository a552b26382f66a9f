"""Answer grading with math-verify: is the model's final answer equal to the reference?

``grade`` never raises on what a model writes. math-verify bounds each parse and comparison with
``signal.alarm``, which only works in the main thread; elsewhere the bounds are dropped (the answers
graded here are short, and a worker runs grading in its main thread).

A job grades every sample of every item, so two things keep it cheap. The reference is parsed once per
distinct reference (an item's samples share it), not once per response. And a response whose final
answer is, as text, the reference's takes a shortcut past sympy: math-verify's ``verify`` compares the
two extracted strings as well as the two values, so equal strings are a correct answer whatever sympy
would say. The shortcut finds that string with math-verify's own patterns and normalisation, stopping
before the sympy parse; it only ever says "correct", and anything else goes through the full path. The
two can differ only where the full path would run out of time parsing an answer that is, as text, the
reference (and then the shortcut's "correct" is the right verdict).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from collections.abc import Sequence
from itertools import groupby
from typing import Any, NamedTuple

#: Seconds math-verify may spend on one parse or one comparison (main thread only).
TIMEOUT_S = 5
#: Distinct references whose parse is kept; a job's evaluation set is usually a few hundred items.
REFERENCE_CACHE_SIZE = 4096

# math-verify warns once on the stdlib logger whenever its timeouts are off; that is our choice, not news.
logging.getLogger("math_verify").setLevel(logging.ERROR)

# A reference that already holds a formula delimiter is passed as it is; ``\$`` is a currency sign.
_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
# The named groups of math-verify's LaTeX patterns that hold one answer each (first, next1 … next5).
_LATEX_GROUP = re.compile(r"(?:first|next\d)_latex")


class Grade(NamedTuple):
    #: The final answer found in the response, as math-verify normalised it; ``None`` if none was found.
    extracted: str | None
    correct: bool


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@functools.cache
def _configs() -> tuple[Any, ...]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(), ExprExtractionConfig())


def _parse(text: str) -> list[Any]:
    from math_verify import parse

    parsed: list[Any] = parse(text, extraction_config=_configs(), parsing_timeout=_timeout())
    return parsed


def _as_text(parsed: Sequence[Any]) -> str | None:
    # parse() returns [sympy value, matched string] when it succeeds; the string is what the model wrote.
    if not parsed:
        return None
    return str(parsed[-1]) if isinstance(parsed[-1], str) else str(parsed[0])


def _as_formula(reference: str) -> str:
    if _UNESCAPED_DOLLAR.search(reference):
        return reference
    # A bare answer becomes one inline formula, so that the LaTeX extractor reads all of it (an interval or
    # a set, not just a number in it); an inline formula cannot span lines, and a matrix often does.
    return "$" + " ".join(reference.split()) + "$"


@functools.lru_cache(maxsize=REFERENCE_CACHE_SIZE)
def _reference(reference: str) -> tuple[Any, ...]:
    return tuple(_parse(_as_formula(reference)))


@functools.cache
def _pattern_groups() -> tuple[tuple[tuple[Any, Any], ...], ...]:
    """math-verify's extraction patterns as ``parse`` tries them: by priority, in order within one."""
    from math_verify.parser import get_extraction_regexes

    ranked = sorted(
        (
            (pattern, target, priority)
            for patterns, target in get_extraction_regexes(_configs())
            for pattern, priority in patterns
        ),
        key=lambda entry: entry[2],
    )
    return tuple(
        tuple((pattern, target) for pattern, target, _ in group)
        for _, group in groupby(ranked, key=lambda entry: entry[2])
    )


def _reported_answer(response: str) -> str | None:
    """The string ``parse(response)`` reports as the answer, where it can be told without sympy.

    ``parse`` takes the first priority with any match, tries its matches from the rightmost, and reports
    the normalised text of the first one tried whether or not sympy can read it. That text needs sympy
    only when one match holds several answers ("$1$ and $2$": joined only if all parse), and a number
    matched outside LaTeX is rendered by its own rules; for both this returns ``None``.
    """
    from dataclasses import replace

    from math_verify import LatexExtractionConfig
    from math_verify.parser import normalize_latex

    for group in _pattern_groups():
        found = [(match, target) for pattern, target in group for match in pattern.finditer(response)]
        if not found:
            continue
        # parse() sorts by (end, -start) descending, keeping pattern order on ties; max() keeps the first.
        match, target = max(found, key=lambda item: (item[0].end(), -item[0].start()))
        if not isinstance(target, LatexExtractionConfig):
            return None
        answers = [
            (name, text) for name, text in match.groupdict().items() if text and _LATEX_GROUP.match(name)
        ]
        if len(answers) != 1:
            return None
        name, text = answers[0]
        config = target.normalization_config
        if name.split("_")[1] == "latexBoxed":
            config = replace(config, boxed="last")
        normalised: str = normalize_latex(text, config=config)
        # An empty text is not reported; the next match's would be, and that one may need sympy.
        return normalised or None
    return None


def _shortcut(response: str, reference: Sequence[Any]) -> Grade | None:
    """``Grade(answer, True)`` if the response's reported answer is the reference's as text, else ``None``."""
    from math_verify.errors import TimeoutException
    from math_verify.utils import timeout

    if not reference or not isinstance(reference[-1], str) or not reference[-1].strip():
        return None
    try:
        # The same patterns under the same bound as parse(): a response that stalls them is left to it.
        answer: str | None = timeout(timeout_seconds=_timeout())(_reported_answer)(response)
    except (Exception, TimeoutException):
        return None
    # verify() strips both strings and calls them equal when both are non-empty and the same.
    if answer is None or answer.strip() != reference[-1].strip():
        return None
    return Grade(extracted=answer, correct=True)


def grade(response: str, reference: str, *, shortcut: bool = True) -> Grade:
    """Grade ``response`` against a plain reference answer: ``19``, ``\\frac{1}{2}``, ``(-\\infty, 3]``.

    ``shortcut=False`` always runs math-verify's parse and verify on the response; the answer is the same
    either way (the tests hold the two to that), only slower.
    """
    from math_verify import verify

    try:
        gold = _reference(reference)
        if shortcut and (fast := _shortcut(response, gold)) is not None:
            return fast
        predicted = _parse(response)
        if not predicted or not gold:
            return Grade(extracted=_as_text(predicted), correct=False)
        # allow_set_relation_comp: "x < 3" answers "(-\infty, 3)"; without it a relation never equals a set.
        correct = bool(
            verify(list(gold), predicted, timeout_seconds=_timeout(), allow_set_relation_comp=True)
        )
    except Exception:
        # Garbage in a model's output is an answer that is wrong, never a failed job.
        return Grade(extracted=None, correct=False)
    return Grade(extracted=_as_text(predicted), correct=correct)


def warm_up() -> threading.Thread:
    """Import math-verify's parsers (sympy, the LaTeX grammar: about half a second) in a thread, so that a
    worker pays for them while its model loads rather than in its first grade."""
    thread = threading.Thread(
        target=grade, args=("\\boxed{\\frac{1}{2}}", "0.5"), name="grading-warm-up", daemon=True
    )
    thread.start()
    return thread
