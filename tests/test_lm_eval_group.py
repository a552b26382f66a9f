"""``kind = "lm_eval"`` under tp × dp: real worker groups (torchrun, DeepSpeed AutoTP over gloo on the
CPU), the toy model, and the shipped task group ``arith_suite`` (greedy generation with two filters, and a
rolling log-likelihood task).

What must hold: sharding and data parallelism change nothing a user can see. The metrics are those of
one process (to float tolerance: the replicas' documents sum in another order, and another batching pads
them otherwise), and so are the logged samples, in the same order. 11 documents: the two replicas get 6
and 5, so lm-eval pads the second's requests to match.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.group import WorkerGroup
from inference.harness.report import in_document_order
from inference.spec import HarnessSpec, InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.task import run_task
from tests.conftest import ToyRun
from tests.test_worker_group import evaluated, run_group

pytestmark = pytest.mark.slow

TOY_TASKS = Path(__file__).resolve().parent.parent / "inference" / "toy" / "lm_eval"
DOCUMENTS = 11


def _spec(checkpoint: Path, folder: Path, *, tp: int, dp: int, engine: str = "deepspeed") -> JobSpec:
    folder.mkdir(parents=True, exist_ok=True)
    return JobSpec(
        job_id=3,
        checkpoint_path=checkpoint,
        result_path=folder / "result.json",
        task=TaskSpec(
            name="suite",
            kind="lm_eval",
            limit=DOCUMENTS,
            batch_size=4,
            metrics=(),
            lm_eval=HarnessSpec(task="arith_suite", include_path=TOY_TASKS, add_bos_token=False),
        ),
        inference=InferenceSpec.model_validate({"engine": engine, "tp": tp, "dp": dp, "threads": 1}),
        max_samples=1000,
    )


@pytest.fixture(scope="module")
def single(toy_run: ToyRun, tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    """The reference: tp = dp = 1, in this process."""
    spec = _spec(toy_run.last_checkpoint, tmp_path_factory.mktemp("single"), tp=1, dp=1, engine="hf")
    result = run_task(spec, WorkerGroup.start(spec.inference))
    assert result is not None
    return result


#: The requests a replica serves: its 6 documents' generations and rolling log-likelihoods.
HALF = {"generate_until": 6, "loglikelihood_rolling": 6}


def _served(folder: Path, rank: int) -> dict[str, int]:
    lines = (folder / f"rank-{rank}.log").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    served: dict[str, int] = next(e["requests"] for e in events if e.get("event") == "harness.served")
    return served


def _assert_as_one_process(result: JobResult, reference: JobResult) -> None:
    found = {m.name: m for m in result.metrics}
    expected = {m.name: m for m in reference.metrics}
    assert set(found) == set(expected)
    # Both tasks of the group, each metric with its n and stderr.
    assert {"arith/exact_match_strict", "arith_ppl/word_perplexity"} <= set(found)
    for name, metric in expected.items():
        assert found[name].value == pytest.approx(metric.value, rel=1e-5), name
        assert found[name].n == metric.n == DOCUMENTS, name
        if metric.stderr is None:
            assert found[name].stderr is None, name
        else:
            assert found[name].stderr == pytest.approx(metric.stderr, rel=1e-5), name
    # Every document's sample, in one process's order, with the same responses.
    assert [s.prompt_id for s in result.samples] == [s.prompt_id for s in reference.samples]
    generated = [
        (s.prompt_id, s.response, s.extracted, s.correct) for s in result.samples if ":" in s.prompt_id
    ]
    assert generated == [
        (s.prompt_id, s.response, s.extracted, s.correct) for s in reference.samples if ":" in s.prompt_id
    ]
    assert len(generated) == 2 * DOCUMENTS  # two filters


@pytest.mark.long
def test_tp2_dp2_gives_the_metrics_and_samples_of_one_process(
    toy_run: ToyRun, single: JobResult, tmp_path: Path
) -> None:
    spec = _spec(toy_run.last_checkpoint, tmp_path, tp=2, dp=2)

    result = evaluated(run_group(spec), tmp_path)

    _assert_as_one_process(result, single)
    # Every rank served its replica's half (6 and 5 documents, the 5 padded to 6); only rank 0 wrote a
    # result.
    assert [_served(tmp_path, rank) for rank in range(4)] == [HALF] * 4
    assert not list(tmp_path.glob("result.rank*.json"))
    # In each replica the two tp ranks compared their responses to both request calls, and agreed.
    assert result.consistency is not None
    assert result.consistency.batches_checked == 4
    assert result.consistency.disagreements == ()


def test_dp2_replicas_split_the_documents_and_give_the_metrics_of_one_process(
    toy_run: ToyRun, single: JobResult, tmp_path: Path
) -> None:
    spec = _spec(toy_run.last_checkpoint, tmp_path, tp=1, dp=2, engine="hf")

    result = evaluated(run_group(spec), tmp_path)

    _assert_as_one_process(result, single)
    assert [_served(tmp_path, rank) for rank in range(2)] == [HALF] * 2
    assert result.consistency is None


def test_replicas_logs_are_put_back_in_one_process_order() -> None:
    one_process = [{"doc_id": d, "filter": f} for f in ("strict", "flexible") for d in range(5)]
    # Two replicas: documents 0, 2, 4 and 1, 3, each replica's log filter by filter.
    replicas = [
        {"doc_id": d, "filter": f} for r in (0, 1) for f in ("strict", "flexible") for d in range(r, 5, 2)
    ]
    assert in_document_order(replicas) == one_process
    assert in_document_order(one_process) == one_process
