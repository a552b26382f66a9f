"""From generated responses to graded samples: correctness, reward, the records metrics read, the outputs
kept for people to read, and the samples that failed.

A sample fails when its reward raises, hangs past its time limit or is not a finite number. It is left out
of every metric (so all of a job's metrics are over the same samples), kept among the outputs with its
error, and reported as a :class:`~inference.spec.Problem`. Only when every sample fails is it the job's
error: then the reward function is broken, not the data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from inference.code.grading import SampleResult
from inference.dataset import Item
from inference.errors import TaskInvalid
from inference.excerpt import cut_text
from inference.generation import Generation
from inference.grading import Grade, grade
from inference.metrics import SampleRecord
from inference.rewards import RewardFailed
from inference.spec import Problem, SampleOutput

#: Failed samples before any succeeded at which the reward is judged broken: a reward that hangs on
#: every sample must not cost every sample its time limit.
BROKEN_AFTER = 10

#: Given (dataset prompt, response, reference) and math-verify's grade, the sample's reward.
Scorer = Callable[[str, str, str, Grade], float]


def builtin_scorer(prompt: str, response: str, reference: str, graded: Grade) -> float:
    """The built-in math reward, from the grade already made (the same verdict as ``math_reward``)."""
    return 1.0 if graded.correct else 0.0


@dataclass(frozen=True)
class Graded:
    #: The samples that did not fail, for the metrics.
    records: tuple[SampleRecord, ...]
    #: The first ``max_samples`` samples, and the failed ones (up to ``max_samples`` more).
    outputs: tuple[SampleOutput, ...]
    problems: tuple[Problem, ...]
    #: Seconds spent grading and in the reward.
    seconds: float


@dataclass(frozen=True)
class SampleLimits:
    n_samples: int
    max_samples: int
    max_text_chars: int


def grade_samples(
    task_name: str,
    items: Sequence[Item],
    prompts: Sequence[str],
    generations: Sequence[Generation],
    limits: SampleLimits,
    scorer: Scorer | None,
    executed: Sequence[SampleResult] | None = None,
) -> Graded:
    """Grade ``generations`` (``limits.n_samples`` per item, prompt-major); ``prompts`` are what the model
    was given, one per item. A code task's samples come ``executed`` (one result per generation): they
    are graded by their tests, not by math-verify."""
    started = time.perf_counter()
    records: list[SampleRecord] = []
    outputs: list[SampleOutput] = []
    problems: list[Problem] = []
    cut = limits.max_text_chars
    for index, generation in enumerate(generations):
        group = index // limits.n_samples
        item = items[group]
        result = None if executed is None else executed[index]
        graded = grade(generation.text, item.reference) if result is None else _code_grade(result)
        reward: float | None = None
        error: str | None = None
        if scorer is not None:
            try:
                reward = scorer(item.prompt, generation.text, item.reference, graded)
            except RewardFailed as exc:
                error = f"reward {exc}"
        if error is None:
            records.append(_record(generation, item, group, graded, reward, result))
        else:
            problems.append(
                Problem(where=f"sample {index}", message=error, prompt_id=item.prompt_id, index=index)
            )
        if not records and len(problems) >= BROKEN_AFTER:
            raise _broken(task_name, len(problems), problems[0], "in a row, with none scored")
        # Failed samples are kept beyond the cap (they are what needs reading), up to as many again.
        failed_kept = error is not None and len(problems) <= limits.max_samples
        if index < limits.max_samples or failed_kept:
            shown = _Shown(index, prompts[group], reward, error, cut)
            outputs.append(_output(shown, generation, item, graded, result))
    if generations and not records:
        raise _broken(task_name, len(generations), problems[0], "(every one)")
    return Graded(tuple(records), tuple(outputs), tuple(problems), time.perf_counter() - started)


def _record(
    generation: Generation,
    item: Item,
    group: int,
    graded: Grade,
    reward: float | None,
    result: SampleResult | None,
) -> SampleRecord:
    """What the metrics read of one scored sample (its full text, never cut)."""
    return SampleRecord(
        correct=graded.correct,
        tokens=generation.tokens,
        truncated=generation.truncated,
        group=group,
        response=generation.text,
        reference=item.reference,
        answer=graded.extracted,
        reward=reward,
        entropy_sum=generation.entropy_sum,
        entropy_tokens=generation.entropy_tokens,
        tests_passed=0 if result is None else result.tests_passed,
        tests_total=0 if result is None else len(result.tests),
        verdict=None if result is None else result.verdict,
    )


@dataclass(frozen=True)
class _Shown:
    """What a stored sample shows beside its generation: its index, prompt, reward or error, and the
    characters its texts are cut to."""

    index: int
    prompt: str
    reward: float | None
    error: str | None
    cut: int


def _output(
    shown: _Shown, generation: Generation, item: Item, graded: Grade, result: SampleResult | None
) -> SampleOutput:
    """One sample as stored for reading (``evald samples``), its texts cut to ``shown.cut``."""
    cut = shown.cut
    return SampleOutput(
        index=shown.index,
        prompt_id=item.prompt_id,
        prompt=cut_text(shown.prompt, cut),
        response=cut_text(generation.text, cut),
        extracted=None if graded.extracted is None else cut_text(graded.extracted, cut),
        reference=cut_text(item.reference, cut),
        correct=graded.correct,
        tokens=generation.tokens,
        truncated=generation.truncated,
        reward=shown.reward,
        entropy=(generation.entropy_sum / generation.entropy_tokens if generation.entropy_tokens else None),
        error=shown.error,
        **({} if result is None else _code_fields(result, cut)),
    )


def _code_grade(result: SampleResult) -> Grade:
    return Grade(extracted=result.code, correct=result.passed)


def _code_fields(result: SampleResult, cut: int) -> dict[str, Any]:
    """A code sample's verdict, its tests by verdict, and its first failing test with the output."""
    failure = result.first_failure
    failed_test = None
    if failure is not None:
        expected = "" if failure.expected is None else f"\nexpected:\n{failure.expected}"
        failed_test = cut_text(failure.name + expected, cut)
    return {
        "verdict": result.verdict,
        "tests_passed": result.tests_passed,
        "tests_total": len(result.tests),
        "verdicts": result.counts,
        "failed_test": failed_test,
        "failed_output": None if failure is None else cut_text(failure.output, cut),
    }


def _broken(task_name: str, failed: int, first: Problem, how: str) -> TaskInvalid:
    return TaskInvalid(
        f"task {task_name!r}: the reward failed on {failed} samples {how}, so the reward function is broken, "
        f"not the data; {first.where}: {first.message}"
    )
