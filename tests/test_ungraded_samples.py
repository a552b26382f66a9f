"""Issue 20, lm-eval: a perplexity sample has a score and no right answer. It is stored as not graded
(``correct`` NULL), so ``evald samples --wrong-only`` lists the wrong answers only; and ``evald results``
prints a huge perplexity with 6 significant digits (JSON keeps the full float). Both backends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from daemon.cli import main
from inference.harness.report import sample_outputs
from storage import migrations, queries
from storage.database import Database
from storage.models import CheckpointState, utcnow
from tests import oldrows
from tests.harness import write_config, write_dataset

#: lm-eval's logged samples of a generate task and of a rolling perplexity task, as its evaluator logs them.
LOGGED = {
    "arith": [
        {
            "doc_id": 0,
            "arguments": [["1+1="]],
            "resps": [["2"]],
            "filtered_resps": ["2"],
            "target": "2",
            "metrics": ["exact_match"],
            "exact_match": 1.0,
        },
        {
            "doc_id": 1,
            "arguments": [["2+2="]],
            "resps": [["5"]],
            "filtered_resps": ["5"],
            "target": "4",
            "metrics": ["exact_match"],
            "exact_match": 0.0,
        },
    ],
    "arith_ppl": [
        {
            "doc_id": 0,
            "arguments": [["1+1=2"]],
            "resps": [[-12.5]],
            "filtered_resps": [-12.5],
            "target": "",
            "metrics": ["word_perplexity", "byte_perplexity", "bits_per_byte"],
            "word_perplexity": [-12.5, 1],
        },
    ],
}
HUGE = 182614805491987406503735721984.0


def test_a_perplexity_sample_is_not_graded_and_an_answer_is() -> None:
    outputs = sample_outputs(LOGGED, prefixed=True, max_samples=10, max_text_chars=100, count_tokens=len)

    assert [(o.prompt_id, o.correct) for o in outputs] == [
        ("arith/0", True),
        ("arith/1", False),
        ("arith_ppl/0", None),
    ]
    assert outputs[2].response == "log-likelihood -12.5 nats"


def _store(database: Database) -> None:
    samples = [
        queries.SampleRow(
            o.index, o.prompt_id, o.prompt, o.response, o.extracted, o.reference, o.correct, 1, False
        )
        for o in sample_outputs(LOGGED, prefixed=True, max_samples=10, max_text_chars=100, count_tokens=len)
    ]
    with database.session() as s:
        run_id = queries.ensure_run(s, "lm", "/lm")
        checkpoint = queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/lm/step_10",
            name="step_10",
            step=10,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=10, tasks=["arith"])
        job = queries.claim_next_job(s, "h:1")
        assert job is not None
        metrics = [
            queries.MetricRow("arith/exact_match", 0.5, 2, 0.5),
            queries.MetricRow("arith_ppl/word_perplexity", HUGE, 1, None),
        ]
        assert queries.complete_job(
            s, job_id=job.id, owner="h:1", metrics=metrics, samples=samples, duration_s=1.0, load_s=0.1
        )


def test_wrong_only_lists_wrong_answers_not_perplexity_samples(
    database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _store(database)
    config = str(write_config(tmp_path, database.url, dataset=write_dataset(tmp_path / "d.jsonl", 2)))
    args = ["--config", config, "samples", "--run", "lm", "--step", "10", "--task", "arith"]

    assert main([*args, "--wrong-only", "--format", "json"]) == 0
    wrong = json.loads(capsys.readouterr().out)["samples"]
    assert [(s["prompt_id"], s["correct"]) for s in wrong] == [("arith/1", False)]

    assert main([*args, "--format", "json"]) == 0
    every = json.loads(capsys.readouterr().out)["samples"]
    assert [s["correct"] for s in every] == [True, False, None]
    assert main(args) == 0
    table = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in table.splitlines() if "arith" in line}
    # index, prompt_id, correct, ...: the perplexity sample is neither yes nor no.
    assert [rows[p][2] for p in ("arith/0", "arith/1", "arith_ppl/0")] == ["yes", "no", "-"]


def test_results_text_prints_a_huge_value_with_significant_digits(
    database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _store(database)
    config = str(write_config(tmp_path, database.url, dataset=write_dataset(tmp_path / "d.jsonl", 2)))

    assert main(["--config", config, "results", "--run", "lm"]) == 0
    text = capsys.readouterr().out
    assert "1.82615e+29" in text and "182614805491987406503735721984" not in text
    assert main(["--config", config, "results", "--run", "lm", "--format", "json"]) == 0
    [ppl] = [r for r in json.loads(capsys.readouterr().out) if r["metric"] == "arith_ppl/word_perplexity"]
    assert ppl["value"] == HUGE


def test_upgrading_ungrades_the_perplexity_samples_stored_as_wrong(database_url: str) -> None:
    """Before 0008 a perplexity sample was stored as wrong (``correct`` false): the migration finds them as
    the harness wrote them (0 tokens, nothing extracted, the response its log-likelihood) and ungrades them;
    a real wrong answer stays wrong."""
    db = Database(database_url)
    migrations.upgrade(db, "0007")
    run_id = oldrows.insert(db, "runs", name="lm", root="/lm", created_at=utcnow())
    job = oldrows.finished_job(db, run_id=run_id, path="/lm/step_10", step=10, task="arith")
    for index, response, extracted, reference, tokens in (
        (0, "5", "5", "4", 1),
        (1, "log-likelihood -12.5 nats", None, "", 0),
    ):
        oldrows.insert(
            db,
            "samples",
            job_id=job,
            index=index,
            prompt_id=str(index),
            prompt="2+2=" if index == 0 else "text",
            response=response,
            extracted=extracted,
            reference=reference,
            correct=False,
            tokens=tokens,
            truncated=False,
        )
    migrations.upgrade(db)
    with db.engine.connect() as conn:
        stored = conn.execute(sa.text('SELECT "index", correct FROM samples ORDER BY "index"')).all()
    assert [(i, None if c is None else bool(c)) for i, c in stored] == [(0, False), (1, None)]
    db.dispose()
