"""Per-sample grades of a run's jobs, by (task, stage, step): what ``evald compare`` pairs prompt by prompt
when two runs were graded on the same prompts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from storage.models import Checkpoint, EvalJob, JobState, Run, Sample

#: (task, stage, step)
Key = tuple[str, str, int]


@dataclass(frozen=True)
class Grade:
    """One counted sample (a sample left out of every metric, with an ``error``, is not one)."""

    prompt_id: str
    #: None: not graded (a perplexity sample).
    correct: bool | None
    tokens: int
    truncated: bool
    reward: float | None


def job_grades(session: Session, *, run: str, keys: Iterable[Key]) -> dict[Key, dict[int, list[Grade]]]:
    """The stored, counted samples of ``run``'s succeeded jobs at ``keys``, by key and then job id (a
    checkpoint evaluated twice has two jobs). Stored samples may be fewer than a job evaluated
    (``max_samples``): the caller checks them against the job's stored metric before pairing."""
    wanted = sorted(set(keys))
    found: dict[Key, dict[int, list[Grade]]] = {}
    # Chunks keep the row-value IN list within what both backends bind comfortably.
    for start in range(0, len(wanted), 200):
        chunk = wanted[start : start + 200]
        query = (
            select(
                EvalJob.task,
                EvalJob.stage,
                Checkpoint.step,
                EvalJob.id,
                Sample.prompt_id,
                Sample.correct,
                Sample.tokens,
                Sample.truncated,
                Sample.reward,
            )
            .join(EvalJob, Sample.job_id == EvalJob.id)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .join(Run, Checkpoint.run_id == Run.id)
            .where(
                Run.name == run,
                EvalJob.state == JobState.SUCCEEDED,
                Sample.error.is_(None),
                tuple_(EvalJob.task, EvalJob.stage, Checkpoint.step).in_(chunk),
            )
            .order_by(EvalJob.id, Sample.index)
        )
        for row in session.execute(query):
            task, stage, step, job_id, prompt_id, correct, tokens, truncated, reward = row
            if step is None:  # never: every key has a step
                continue
            jobs = found.setdefault((task, stage, step), {})
            jobs.setdefault(job_id, []).append(Grade(prompt_id, correct, tokens, truncated, reward))
    return found
