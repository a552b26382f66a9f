"""A metric over no samples (n = 0, stored as no number) is shown as "no samples" wherever a person or a
program looks, never dropped without a word (issue 31): ``evald results`` (a "no samples" cell; JSON and
CSV with value null and ``no_samples``), ``evald status`` (the newest results), the API (``/results``,
``/results/latest``, ``/series``' ``no_samples`` steps) and Prometheus (``evald_metric_samples`` 0, no
``evald_metric_value`` sample). On SQLite (NULL) and PostgreSQL (NaN) alike."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from daemon.cli import main
from daemon.config import load_config
from daemon.web.app import create_app
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.harness import upgraded, write_config, write_dataset


def _store(database: Database, step: int, metrics: list[queries.MetricRow]) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, "toy", "/r")
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/r/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=["arith"])
        job = queries.claim_next_job(s, "h:1")
        assert job is not None
        queries.complete_job(
            s, job_id=job.id, owner="h:1", duration_s=1.0, load_s=0.1, metrics=metrics, samples=[]
        )


@pytest.fixture
def stored(database_url: str, tmp_path: Path) -> tuple[Path, Database]:
    database = upgraded(database_url)
    # Step 10 has correct answers; at step 20 none was correct: their mean length is over no samples.
    _store(
        database,
        10,
        [
            queries.MetricRow("accuracy", 0.5, 4, 0.25),
            queries.MetricRow("response_length_correct", 7.0, 2, 1.0),
        ],
    )
    _store(
        database,
        20,
        [
            queries.MetricRow("accuracy", 0.0, 4, 0.1),
            queries.MetricRow("response_length_correct", math.nan, 0, None),
        ],
    )
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "arith.jsonl", 4))
    return config, database


def test_the_cli_says_no_samples(stored: tuple[Path, Database], capsys: pytest.CaptureFixture[str]) -> None:
    config, database = stored
    base = ["--config", str(config)]
    assert main([*base, "results", "--metric", "response_length_correct"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines
    assert "  no samples  " in lines[3] and "step_20" in lines[3] and lines[3].split()[-3:-1] == ["0", "-"]
    assert "no samples" not in lines[2]

    assert main([*base, "results", "--metric", "response_length_correct", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["value"], r["n"], r["no_samples"]) for r in rows] == [
        (10, 7.0, 2, False),
        (20, None, 0, True),
    ]
    assert main([*base, "results", "--metric", "response_length_correct", "--format", "csv"]) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["step"], r["value"], r["n"], r["no_samples"]) for r in parsed] == [
        ("10", "7.0", "2", "False"),
        ("20", "", "0", "True"),
    ]

    assert main([*base, "status"]) == 0
    text = capsys.readouterr().out
    assert (
        "  no samples:  response_length_correct [arith/full] at step 20 (step_20), the newest evaluated: "
        "computed over no samples (n = 0)"
    ) in text.splitlines(), text
    assert main([*base, "status", "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)["runs"]["toy"]["no_samples"]
    assert shown == [
        {
            "step": 20,
            "checkpoint": "step_20",
            "task": "arith",
            "stage": "full",
            "metric": "response_length_correct",
        }
    ]
    database.dispose()


def test_the_api_and_prometheus_say_no_samples(stored: tuple[Path, Database]) -> None:
    config, database = stored
    with TestClient(create_app(load_config(config), database=database)) as client:
        rows = client.get("/api/v1/results", params={"metric": "response_length_correct"}).json()["items"]
        assert [(r["step"], r["value"], r["n"], r["no_samples"]) for r in rows] == [
            (10, 7.0, 2, False),
            (20, None, 0, True),
        ]
        latest = {r["metric"]: r for r in client.get("/api/v1/results/latest").json()["items"]}
        assert (latest["response_length_correct"]["value"], latest["response_length_correct"]["n"]) == (
            None,
            0,
        )
        assert latest["response_length_correct"]["no_samples"] is True
        assert latest["accuracy"]["no_samples"] is False and latest["accuracy"]["value"] == 0.0

        (series,) = client.get(
            "/api/v1/runs/toy/series", params={"metric": "response_length_correct"}
        ).json()["series"]
        assert (series["step"], series["value"], series["n"], series["no_samples"]) == (
            [10, 20],
            [7.0, None],
            [2, 0],
            [20],
        )

        scrape = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(scrape)}
    values = {s.labels["metric"]: s.value for s in families["evald_metric_value"].samples}
    counts = {s.labels["metric"]: s.value for s in families["evald_metric_samples"].samples}
    assert values == {"accuracy": 0.0}  # no number for a mean over nothing
    assert counts == {"accuracy": 4, "response_length_correct": 0}
    database.dispose()
