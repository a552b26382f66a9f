"""Streamed judging (issue 34): a code job's samples are judged in the sandbox while the model generates
the next batches, and the results are exactly those of judging everything after generation.

Real worker processes, the toy model generating, real sandboxed runs. The rows are those of
tests/test_code_worker.py (the row's prefix decides the verdict; the toy's answer is appended after a
``#``), repeated under other ids so that there are many small batches. What is compared: every stored
sample's verdict, tests, extracted code and failing output against :meth:`Judge.judge` run afterwards on
the stored responses (judging after generation, as before streaming), and the samples and metrics of a
dp=2 job, where half the samples (the other replica's) reach rank 0 only at the end, against dp=1. The
overlap is read from the worker's own log: batches judged before the last batch was generated.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from inference.code.judge import Judge, JudgingPool
from inference.code.problems import read_problems
from inference.spec import CodeLimits, CodeSpec, JobResult, JobSpec, TaskSpec
from tests.conftest import ToyRun
from tests.test_code_worker import PREFIXES, VERDICTS
from tests.test_worker import job, run_worker
from tests.test_worker_group import evaluated, group_spec, run_group

#: Quick rows, repeated: one slow (CPU-limit) row is enough, and it is not repeated.
REPEATED = ("right", "wrong", "raises", "broken")
COPIES = 6
METRICS = ("pass@1", "test_pass_rate", "wrong_answer_rate", "timeout_rate", "compile_error_rate")
CODE = CodeSpec(
    extract="append",
    prefix_field="prefix",
    parallel=2,
    limits=CodeLimits(cpu_s=1, wall_s=5, memory_mb=256),
)


def rows() -> list[dict[str, Any]]:
    chosen = [(name, name) for name in PREFIXES]
    chosen += [(f"{name}-{copy}", name) for copy in range(COPIES) for name in REPEATED]
    return [
        {
            "id": row_id,
            "problem": "What is 2 + 4?",
            "prefix": PREFIXES[kind],
            "tests": [{"input": "", "output": "6\n"}],
        }
        for row_id, kind in chosen
    ]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stream") / "code.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows()), encoding="utf-8")
    return path


def code_task(dataset: Path) -> TaskSpec:
    from inference.toy.problems import PROMPT_TEMPLATE

    return TaskSpec(
        name="toy-code",
        kind="code",
        dataset=dataset,
        prompt_template=PROMPT_TEMPLATE,
        id_field="id",
        # One item a batch: many batches, so judging has generation to overlap.
        batch_size=1,
        max_new_tokens=12,
        code=CODE,
        metrics=METRICS,
    )


@pytest.fixture(scope="module")
def streamed(
    toy_run: ToyRun, dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[JobResult, list[dict[str, Any]]]:
    """The dp=1 job's result and its worker's log events."""
    folder = tmp_path_factory.mktemp("single")
    spec: JobSpec = job(toy_run.last_checkpoint, dataset, folder)
    spec = spec.model_copy(update={"task": code_task(dataset), "max_samples": 1000})
    done, result = run_worker(spec, folder)
    assert done.returncode == 0, done.stderr[-3000:]
    assert result.error is None
    return result, events(done.stderr)


def events(log: str) -> list[dict[str, Any]]:
    found = []
    for line in log.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            event["at"] = datetime.fromisoformat(event["timestamp"])
            found.append(event)
    return found


def named(found: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [event for event in found if event["event"] == name]


def timeless(output: str | None) -> str | None:
    """A failing output without the seconds a time limit took to stop it (they vary run to run)."""
    return None if output is None else re.sub(r"after \d+\.\d s\)", "after … s)", output)


def stored(result: JobResult) -> list[dict[str, Any]]:
    return [{**s.model_dump(), "failed_output": timeless(s.failed_output)} for s in result.samples]


def test_streamed_verdicts_are_those_of_judging_after_generation(
    streamed: tuple[JobResult, list[dict[str, Any]]], dataset: Path
) -> None:
    result, _ = streamed
    assert [s.index for s in result.samples] == list(range(len(rows())))
    by_kind = {row["id"]: row["id"].split("-")[0] for row in rows()}
    assert {s.prompt_id: s.verdict for s in result.samples} == {
        row_id: VERDICTS[kind] for row_id, kind in by_kind.items()
    }

    problems = {p.prompt_id: p for p in read_problems(dataset, CODE, id_field="id").problems}
    judge = Judge("toy-code", CODE)
    afterwards = judge.judge([(problems[s.prompt_id], s.response) for s in result.samples])

    for sample, expected in zip(result.samples, afterwards, strict=True):
        failure = expected.first_failure
        assert (
            sample.extracted,
            sample.correct,
            sample.verdict,
            sample.tests_passed,
            sample.tests_total,
            sample.verdicts,
            timeless(sample.failed_output),
        ) == (
            expected.code,
            expected.passed,
            expected.verdict,
            expected.tests_passed,
            len(expected.tests),
            expected.counts,
            None if failure is None else timeless(failure.output),
        ), sample.prompt_id


def test_judging_overlaps_generation(streamed: tuple[JobResult, list[dict[str, Any]]]) -> None:
    result, found = streamed
    queued = named(found, "code.batch_queued")
    judged = named(found, "code.batch_judged")
    assert [e["batch"] for e in queued] == list(range(len(rows())))
    assert sorted(e["batch"] for e in judged) == list(range(len(rows())))
    # A batch is queued the moment its generation ends: batches judged before the last one was queued
    # ran in the sandbox while the model generated.
    last_generated = queued[-1]["at"]
    early = [e["batch"] for e in judged if e["at"] < last_generated]
    assert early, [(e["batch"], e["at"]) for e in judged]
    (summary,) = named(found, "code.judged")
    assert (summary["samples"], summary["streamed"], summary["late"]) == (len(rows()), len(rows()), 0)
    # What judging kept on the critical path is what the job reports as its grading wait.
    assert result.timing is not None
    assert summary["tail_s"] <= result.timing.grading_s


def test_a_dp2_job_judges_the_other_replicas_samples_at_the_end_with_the_same_results(
    toy_run: ToyRun,
    dataset: Path,
    streamed: tuple[JobResult, list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    single, _ = streamed
    task = code_task(dataset).model_dump()
    spec = group_spec(toy_run.last_checkpoint, dataset, tmp_path, tp=1, dp=2, engine="hf", task=task)

    result = evaluated(run_group(spec), tmp_path)

    assert stored(result) == stored(single)
    assert {(m.name, m.value, m.n, m.stderr) for m in result.metrics if m.name in METRICS} == {
        (m.name, m.value, m.n, m.stderr) for m in single.metrics if m.name in METRICS
    }
    (summary,) = named(events((tmp_path / "rank-0.log").read_text()), "code.judged")
    # Rank 0 streamed its own replica's half; the other half came with the gather.
    assert summary["streamed"] > 0
    assert summary["late"] > 0
    assert summary["streamed"] + summary["late"] == len(rows())


def test_leaving_the_pool_on_an_error_fails_what_is_queued_and_leaves_nothing_running(dataset: Path) -> None:
    """A job whose generation fails mid-way does not wait for every queued program: the executions under
    way finish (their limits bound them), the rest never start, and every handed-in sample fails."""
    spins = next(p for p in read_problems(dataset, CODE, id_field="id").problems if p.prompt_id == "spins")
    judge = Judge("toy-code", CODE.model_copy(update={"parallel": 1}))
    with pytest.raises(RuntimeError, match="generation failed"), JudgingPool(judge) as pool:
        # Six distinct programs, each spinning to its 1 s CPU limit.
        handed = [pool.submit(spins, f"{number}") for number in range(6)]
        raise RuntimeError("generation failed")
    assert all(future.done() for future in handed)
    failed = [future for future in handed if future.exception() is not None]
    assert len(failed) >= 5, [future.result().verdict for future in handed if future not in failed]
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(spins, "late").result()


@pytest.mark.long
def test_a_tp2_job_streams_with_the_tp_votes_numbered_as_in_the_whole_job(
    toy_run: ToyRun,
    dataset: Path,
    streamed: tuple[JobResult, list[dict[str, Any]]],
    tmp_path: Path,
) -> None:
    """Rank 0 generates batch by batch while its tp peer generates all at once: each batch's votes must
    still carry the batch's number in the job, or the two ranks would wait on different votes."""
    single, _ = streamed
    task = code_task(dataset).model_dump()
    spec = group_spec(toy_run.last_checkpoint, dataset, tmp_path, tp=2, dp=1, task=task)

    result = evaluated(run_group(spec), tmp_path)

    assert stored(result) == stored(single)
    assert result.consistency is not None
    assert (result.consistency.batches_checked, result.consistency.disagreements) == (len(rows()), ())
