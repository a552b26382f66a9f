"""``evald samples``: one job's per-sample outputs and the inputs it left out, as a table or JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from daemon.analysis.report.cells import cell, one_line, table

if TYPE_CHECKING:
    from storage.queries import JobSamples, ProblemRow, SampleRow

#: How much of a prompt id, extracted answer or reference the samples table shows; the response gets the
#: rest of the terminal, but never less than RESPONSE_MIN_CHARS (``--format json`` shows everything).
FIELD_CHARS = 24
RESPONSE_MIN_CHARS = 20
SAMPLE_COLUMNS = (
    "index",
    "prompt_id",
    "correct",
    "reward",
    "tokens",
    "truncated",
    "extracted",
    "reference",
    "response",
)


#: A code task's samples add a column: tests passed of the total.
TESTS_COLUMN = "tests"


def _verdict(sample: SampleRow) -> str:
    # A sample with an error was never graded: neither right nor wrong, and out of every metric.
    if sample.error is not None:
        return "error"
    if sample.correct is None:
        return "-"  # not graded: a perplexity sample has a score, no right answer
    if sample.verdict is not None and not sample.correct:
        return sample.verdict  # a code sample: how it failed (wrong_answer, timeout, ...)
    return "yes" if sample.correct else "no"


def _tests(sample: SampleRow) -> str:
    return "-" if sample.tests_total is None else f"{sample.tests_passed or 0}/{sample.tests_total}"


def _failed_line(sample: SampleRow) -> str:
    test = one_line(sample.failed_test or "", 200)
    output = one_line(sample.failed_output or "(nothing)", 200)
    return f"sample {sample.index} failed {sample.verdict}: test: {test} | output: {output}"


def sample_dict(sample: SampleRow) -> dict[str, object]:
    """One sample as ``evald samples --format json`` and the API give it."""
    shown = asdict(sample)
    if sample.verdict is None:
        # Not a code sample: its JSON keeps the fields it always had.
        for name in ("verdict", "tests_passed", "tests_total", "verdicts", "failed_test", "failed_output"):
            del shown[name]
    return shown


def _short(text: str | None) -> str | None:
    return None if text is None else one_line(text, FIELD_CHARS)


def _problem_line(problem: ProblemRow) -> str:
    prompt = f" (prompt {problem.prompt_id})" if problem.prompt_id is not None else ""
    return f"problem: {problem.where}{prompt}: {problem.message}"


def samples_text(found: JobSamples, *, width: int, wrong_only: bool = False) -> str:
    """A heading, one table row per sample (the response flattened and cut to fit ``width``), then one
    line per problem."""
    shown = f"{len(found.samples)} wrong of {found.stored}" if wrong_only else str(found.stored)
    heading = (
        f"run {found.run}, step {found.step} ({found.checkpoint}), task {found.task}, stage {found.stage}, "
        f"job {found.job_id}: {shown} sample(s), {len(found.problems)} problem(s)"
    )
    code = any(s.tests_total is not None for s in found.samples)
    columns = (*SAMPLE_COLUMNS[:3], TESTS_COLUMN, *SAMPLE_COLUMNS[3:]) if code else SAMPLE_COLUMNS
    rows = [
        [
            s.index,
            _short(s.prompt_id),
            _verdict(s),
            *([_tests(s)] if code else []),
            s.reward,
            s.tokens,
            "yes" if s.truncated else "no",
            _short(s.extracted),
            _short(s.reference),
        ]
        for s in found.samples
    ]
    fixed = [max([len(h)] + [len(cell(r[i])) for r in rows]) for i, h in enumerate(columns[:-1])]
    room = max(RESPONSE_MIN_CHARS, width - sum(fixed) - 2 * len(fixed))
    for row, sample in zip(rows, found.samples, strict=True):
        row.append(one_line(sample.response, room))
    lines = [heading, table(columns, rows)]
    failed = [s for s in found.samples if s.failed_test is not None]
    lines.extend(one_line(_failed_line(s), max(width, RESPONSE_MIN_CHARS)) for s in failed)
    lines.extend(one_line(_problem_line(p), max(width, RESPONSE_MIN_CHARS)) for p in found.problems)
    return "\n".join(lines)


def job_fields(found: JobSamples) -> dict[str, object]:
    """Which job the samples are of, as the JSON of ``evald samples`` and the API head them."""
    return {
        "run": found.run,
        "step": found.step,
        "task": found.task,
        "stage": found.stage,
        "job_id": found.job_id,
        "checkpoint": found.checkpoint,
        "stored_samples": found.stored,
    }


def samples_json(found: JobSamples, *, wrong_only: bool = False) -> str:
    return json.dumps(
        {
            **job_fields(found),
            "wrong_only": wrong_only,
            "samples": [sample_dict(s) for s in found.samples],
            "problems": [asdict(p) for p in found.problems],
        },
        indent=1,
    )
