"""evald's built-in tasks and the same data run by lm-evaluation-harness (``kind = "lm_eval"``) agree.

Both run in this process on the toy checkpoint, each loading it through evald's loader, as a worker does:

- exact match on greedy decoding: evald's ``generate`` task with its ``exact_match`` metric against
  lm-eval's ``exact_match,strict-match`` of the shipped ``arith`` task. The common definition: the final
  answer is the contents of the last ``\\boxed{}``, compared with the reference as text. One difference
  is definitional: a response with no ``\\boxed{}`` is compared whole by evald and is ``[invalid]`` for
  lm-eval, so the two coincide when no unboxed response equals its reference (checked, not assumed).
- perplexity: evald's ``likelihood`` task's ``word_perplexity``, ``byte_perplexity`` and ``bits_per_byte``
  against lm-eval's ``loglikelihood_rolling`` task ``arith_ppl`` with ``add_bos_token = false``: both then
  score every text token given BOS and the tokens before it. With lm-eval's default (the toy tokenizer
  adds BOS itself) lm-eval scores BOS too, after a second BOS, and the numbers differ (shown below).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.group import WorkerGroup
from inference.metrics.accuracy import last_boxed
from inference.spec import HarnessSpec, InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.task import run_task
from inference.toy.problems import DATA_DIR, PROMPT_TEMPLATE
from tests.conftest import ToyRun

TOY_TASKS = Path(__file__).resolve().parent.parent / "inference" / "toy" / "lm_eval"
ITEMS = 100


def _run(task: TaskSpec, checkpoint: Path, folder: Path) -> JobResult:
    folder.mkdir(parents=True, exist_ok=True)
    spec = JobSpec(
        job_id=1,
        checkpoint_path=checkpoint,
        task=task,
        inference=InferenceSpec(engine="hf", threads=2),
        result_path=folder / "result.json",
    )
    result = run_task(spec, WorkerGroup.start(spec.inference))
    assert result is not None
    return result


def _metrics(result: JobResult) -> dict[str, float]:
    return {m.name: m.value for m in result.metrics}


def _generate(dataset: Path, limit: int) -> TaskSpec:
    return TaskSpec(
        name="arith",
        dataset=dataset,
        prompt_template=PROMPT_TEMPLATE,
        limit=limit,
        max_new_tokens=32,
        metrics=("exact_match", "accuracy"),
    )


def _harness(name: str, include_path: Path, limit: int, add_bos_token: bool | None = None) -> TaskSpec:
    return TaskSpec(
        name=name,
        kind="lm_eval",
        limit=limit,
        metrics=(),
        lm_eval=HarnessSpec(task=name, include_path=include_path, add_bos_token=add_bos_token),
    )


def _responses(result: JobResult, suffix: str = "") -> list[str]:
    return [s.response for s in result.samples if s.prompt_id.endswith(suffix)]


def _assert_exact_match_agrees(evald: JobResult, harness: JobResult) -> float:
    # The same greedy tokens, item by item: lm-eval's "until" and evald's EOS end them at the same place.
    assert _responses(evald) == _responses(harness, ":strict-match")
    unboxed_hits = [s for s in evald.samples if last_boxed(s.response) is None and s.response == s.reference]
    assert not unboxed_hits, (
        "the definitions differ on these; the comparison below would not be like for like"
    )
    value = _metrics(evald)["exact_match"]
    assert value == _metrics(harness)["exact_match_strict"]
    return value


@pytest.mark.long
def test_exact_match_on_the_shipped_arithmetic_agrees(toy_run: ToyRun, tmp_path: Path) -> None:
    evald = _run(_generate(DATA_DIR / "arith500.jsonl", ITEMS), toy_run.last_checkpoint, tmp_path / "g")
    harness = _run(_harness("arith", TOY_TASKS, ITEMS), toy_run.last_checkpoint, tmp_path / "h")

    _assert_exact_match_agrees(evald, harness)
    assert {m.n for m in harness.metrics} == {ITEMS}


def test_exact_match_agrees_where_answers_are_right_and_wrong(toy_run: ToyRun, tmp_path: Path) -> None:
    # A toy model this young answers every problem alike; rewriting every other reference to the answer
    # it gives makes a set where both definitions must find exactly those hits.
    rows = [json.loads(line) for line in (DATA_DIR / "arith500.jsonl").read_text().splitlines()[:40]]
    probe = _run(_generate(DATA_DIR / "arith500.jsonl", 1), toy_run.last_checkpoint, tmp_path / "p")
    given = last_boxed(probe.samples[0].response) or probe.samples[0].response
    for row in rows[::2]:
        row["answer"] = given
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shipped = (TOY_TASKS / "arith.yaml").read_text(encoding="utf-8")
    (tasks / "arith.yaml").write_text(shipped.replace("../data/arith500.jsonl", str(data)), encoding="utf-8")

    evald = _run(_generate(data, len(rows)), toy_run.last_checkpoint, tmp_path / "g")
    harness = _run(_harness("arith", tasks, len(rows)), toy_run.last_checkpoint, tmp_path / "h")

    value = _assert_exact_match_agrees(evald, harness)
    assert 0.4 <= value < 1.0


def test_word_and_byte_perplexity_agree_with_lm_eval(toy_run: ToyRun, tmp_path: Path) -> None:
    names = ("word_perplexity", "byte_perplexity", "bits_per_byte")
    likelihood = TaskSpec(
        name="arith-text",
        kind="likelihood",
        dataset=DATA_DIR / "arith-text.jsonl",
        limit=ITEMS,
        metrics=names,
    )
    evald = _metrics(_run(likelihood, toy_run.last_checkpoint, tmp_path / "l"))
    harness = _run(
        _harness("arith_ppl", TOY_TASKS, ITEMS, add_bos_token=False), toy_run.last_checkpoint, tmp_path / "h"
    )
    default = _run(_harness("arith_ppl", TOY_TASKS, ITEMS), toy_run.last_checkpoint, tmp_path / "d")

    for name in names:
        assert evald[name] == pytest.approx(_metrics(harness)[name], rel=1e-4), name
    # lm-eval's default adds a BOS before the tokenizer's own: another definition, another number.
    assert _metrics(default)["byte_perplexity"] != pytest.approx(evald["byte_perplexity"], rel=1e-3)
    assert {s.prompt_id for s in harness.samples} == {str(i) for i in range(ITEMS)}
