"""One job's graded samples and the inputs its metrics left out: what ``evald samples`` shows."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from storage.errors import StorageError
from storage.models import Checkpoint, EvalJob, JobState, Run, Sample, SampleProblem


@dataclass(frozen=True)
class SampleRow:
    index: int
    prompt_id: str
    prompt: str
    response: str
    extracted: str | None
    reference: str
    #: None: not graded (an lm-eval perplexity sample has a score, no right answer).
    correct: bool | None
    tokens: int
    truncated: bool
    reward: float | None = None
    #: Mean token entropy over the response, in nats.
    entropy: float | None = None
    #: Why the sample is left out of every metric; None for one that counts.
    error: str | None = None
    #: A code task's sample: ``passed`` or the first failing test's verdict, tests passed of the total,
    #: tests by verdict, and the first failing test with what the program wrote.
    verdict: str | None = None
    tests_passed: int | None = None
    tests_total: int | None = None
    verdicts: dict[str, int] | None = None
    failed_test: str | None = None
    failed_output: str | None = None


@dataclass(frozen=True)
class ProblemRow:
    """An input a job's metrics left out: a bad dataset row (``where`` = ``FILE:LINE``) or a failed sample
    (``where`` = ``sample INDEX``)."""

    where: str
    message: str
    prompt_id: str | None = None
    index: int | None = None


class SamplesUnavailable(StorageError):
    """The samples asked for are not stored: the message names what is missing and what exists instead."""


@dataclass(frozen=True)
class JobSamples:
    run: str
    step: int
    task: str
    stage: str
    job_id: int
    checkpoint: str
    #: Samples stored for the job before any filter (``max_samples`` may have capped them).
    stored: int
    samples: list[SampleRow]
    problems: list[ProblemRow]


#: The stage read when none is asked for: the full set where it ran, else the quick subset.
STAGE_PREFERENCE = ("full", "quick")
#: How many steps the error for a missing step lists (the nearest ones), and names of anything else.
NEAREST_STEPS = 5
LISTED = 20
#: How much of a failed job's error the not-succeeded message carries.
ERROR_CHARS = 300


def job_samples(
    session: Session, *, run: str, step: int, task: str, stage: str | None = None, wrong_only: bool = False
) -> JobSamples:
    """The samples and problems of the job for ``task`` on ``run``'s checkpoint at ``step``.

    ``stage`` defaults to ``full`` where that job exists, else ``quick``. ``wrong_only`` keeps the samples
    graded wrong (``correct`` false and no error: an ungraded sample, NULL, is not wrong); the problems
    are all kept, since each is an input the metrics left out. Raises :class:`SamplesUnavailable` naming
    what is missing and what exists.
    """
    run_id = _run_id(session, run)
    job = _job_at(session, run_id=run_id, run=run, step=step, task=task, stage=stage)
    query = select(Sample).where(Sample.job_id == job.id).order_by(Sample.index)
    if wrong_only:
        query = query.where(Sample.correct.is_(False), Sample.error.is_(None))
    stored = session.scalar(select(func.count()).select_from(Sample).where(Sample.job_id == job.id))
    problems = session.scalars(
        select(SampleProblem).where(SampleProblem.job_id == job.id).order_by(SampleProblem.id)
    )
    return JobSamples(
        run=run,
        step=step,
        task=task,
        stage=job.stage,
        job_id=job.id,
        checkpoint=job.checkpoint,
        stored=stored or 0,
        samples=[_sample_row(s) for s in session.scalars(query)],
        problems=[ProblemRow(p.where, p.message, p.prompt_id, p.index) for p in problems],
    )


def _sample_row(s: Sample) -> SampleRow:
    return SampleRow(**{f.name: getattr(s, f.name) for f in fields(SampleRow)})


def _listing(names: Sequence[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:LISTED])
    return shown if len(names) <= LISTED else f"{shown} and {len(names) - LISTED} more"


def _run_id(session: Session, run: str) -> int:
    run_id = session.scalar(select(Run.id).where(Run.name == run))
    if run_id is None:
        known = list(session.scalars(select(Run.name).order_by(Run.name)))
        raise SamplesUnavailable(f"no run {run!r} in the database (runs: {_listing(known)})")
    return run_id


def nearest_steps(steps: Iterable[int], step: int, count: int = NEAREST_STEPS) -> list[int]:
    """The ``count`` distinct steps closest to ``step`` (the lower of two as close), in step order."""
    return sorted(sorted(set(steps), key=lambda s: (abs(s - step), s))[:count])


def _steps_hint(steps: Sequence[int], step: int) -> str:
    if not steps:
        return "it has no checkpoint with a step yet"
    if len(steps) <= NEAREST_STEPS:
        return "steps: " + ", ".join(map(str, sorted(steps)))
    nearest = nearest_steps(steps, step)
    # Asked below the first step (or past the newest), the nearest are the run's first (or last) few:
    # said so, since a list that starts at the run's first step looks like no search at all.
    side = f"; none below {nearest[0]}" if step < min(steps) else ""
    side = f"; none above {nearest[-1]}" if step > max(steps) else side
    return f"nearest steps: {', '.join(map(str, nearest))} (of {len(steps)}{side})"


@dataclass(frozen=True)
class _StepJob:
    id: int
    task: str
    stage: str
    state: JobState
    error_kind: str | None
    error: str | None
    checkpoint: str


def _job_at(session: Session, *, run_id: int, run: str, step: int, task: str, stage: str | None) -> _StepJob:
    """The job the caller means, or :class:`SamplesUnavailable` saying which part of it does not exist."""
    at_step = and_(Checkpoint.run_id == run_id, Checkpoint.step == step)
    if not session.scalar(select(func.count()).select_from(Checkpoint).where(at_step)):
        found = session.scalars(select(Checkpoint.step).distinct().where(Checkpoint.run_id == run_id))
        steps = [s for s in found if s is not None]
        raise SamplesUnavailable(f"run {run!r} has no checkpoint at step {step} ({_steps_hint(steps, step)})")
    jobs = [
        _StepJob(*row)
        for row in session.execute(
            select(
                EvalJob.id,
                EvalJob.task,
                EvalJob.stage,
                EvalJob.state,
                EvalJob.error_kind,
                EvalJob.error,
                Checkpoint.name,
            )
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .where(at_step)
            .order_by(EvalJob.task, EvalJob.stage, EvalJob.id.desc())
        )
    ]
    candidates = [j for j in jobs if j.task == task and (stage is None or j.stage == stage)]
    if not candidates:
        what = f"{stage} job" if stage else "job"
        raise SamplesUnavailable(
            f"run {run!r} has no {what} for task {task!r} at step {step} (jobs there: {_job_listing(jobs)})"
        )
    chosen = _preferred(candidates)
    if chosen.state is not JobState.SUCCEEDED:
        raise SamplesUnavailable(_not_succeeded(chosen, run, step, others=candidates))
    return chosen


def _preferred(candidates: Sequence[_StepJob]) -> _StepJob:
    """The preferred stage's job; of two checkpoints at one step (two folder names), the succeeded job,
    then the newest."""
    stages = {j.stage for j in candidates}
    stage = next((s for s in STAGE_PREFERENCE if s in stages), min(stages))
    of_stage = [j for j in candidates if j.stage == stage]
    return min(of_stage, key=lambda j: (j.state is not JobState.SUCCEEDED, -j.id))


def _job_listing(jobs: Sequence[_StepJob]) -> str:
    stages: dict[str, list[str]] = {}
    for job in jobs:
        if job.stage not in stages.setdefault(job.task, []):
            stages[job.task].append(job.stage)
    return _listing([f"{task} [{', '.join(sorted(names))}]" for task, names in stages.items()])


def _not_succeeded(job: _StepJob, run: str, step: int, *, others: Sequence[_StepJob]) -> str:
    message = f"job {job.id} ({job.task}/{job.stage} at step {step} of run {run!r}) has not succeeded: it is "
    message += str(job.state.value)
    if job.error:
        error = " ".join(job.error.split())
        if len(error) > ERROR_CHARS:
            error = error[: ERROR_CHARS - 1] + "…"
        message += f" ({job.error_kind}: {error})" if job.error_kind else f" ({error})"
    # A pending full job is the common case right after a quick one: say that the quick one can be read.
    done = sorted({j.stage for j in others if j.state is JobState.SUCCEEDED and j.stage != job.stage})
    if done:
        message += f"; its {', '.join(done)} stage has succeeded"
    return message
