"""The HTTP API of ``evald serve`` on SQLite and PostgreSQL: what each route answers, that it matches the
CLI row for row, that bad input is a 4xx naming the parameter, and that the service cannot write."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from starlette.applications import Starlette
from starlette.testclient import TestClient

from daemon.alerts.lifecycle import fingerprint
from daemon.analysis.smoothing import parse_smoothing
from daemon.cli import main
from daemon.config import Config, load_config
from daemon.errors import ConfigError
from daemon.web.app import create_app
from daemon.web.params import MAX_LIMIT
from daemon.web.server import build
from storage import queries, scheduling
from storage.database import Database
from storage.models import Alert, AlertState, Base, CheckpointState
from tests.fixtures import fresh_postgres
from tests.harness import upgraded, write_config, write_dataset

TASK = "arith"
#: run → [(step, accuracy, stderr)]; every step stores accuracy and wall_s, and four samples.
SERIES = {
    "alpha": [(10, 0.25, 0.05), (20, 0.5, 0.05), (30, 0.75, 0.04), (40, 0.5, 0.05), (50, 0.6, 0.05)],
    "beta": [(10, 0.3, 0.06), (30, 0.4, 0.06)],
}


@dataclass(frozen=True)
class Stored:
    url: str
    config: Path


def _samples(step: int) -> list[queries.SampleRow]:
    # Sample i is right when i < step / 10 (capped at 4): step 10 has one right, three wrong.
    return [
        queries.SampleRow(
            index=i,
            prompt_id=f"p{i}",
            prompt=f"{i}+{step}",
            response=str(i + step if i < step // 10 else -1),
            extracted=str(i + step if i < step // 10 else -1),
            reference=str(i + step),
            correct=i < step // 10,
            tokens=3,
            truncated=False,
        )
        for i in range(4)
    ]


def _store(database: Database) -> None:
    with database.session() as s:
        run_ids = {run: queries.ensure_run(s, run, f"/runs/{run}") for run in SERIES}
    for run, points in SERIES.items():
        for step, accuracy, stderr in points:
            with database.session() as s:
                checkpoint_id = queries.record_checkpoint(
                    s,
                    run_id=run_ids[run],
                    path=f"/runs/{run}/step_{step}",
                    name=f"step_{step}",
                    step=step,
                    epoch=None,
                    layout="hf",
                    state=CheckpointState.READY,
                )
                queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[TASK])
                job = queries.claim_next_job(s, "t:1")
                assert job is not None
                problems = [queries.ProblemRow("d.jsonl:3", "no answer field", "p9")] if step == 20 else []
                assert queries.complete_job(
                    s,
                    job_id=job.id,
                    owner="t:1",
                    metrics=[
                        queries.MetricRow("accuracy", accuracy, 4, stderr),
                        queries.MetricRow("wall_s", float(step), None, None),
                    ],
                    samples=_samples(step),
                    duration_s=1.0,
                    load_s=0.1,
                    problems=problems,
                )
    with database.session() as s:
        # beta's queue: one failed job and one deferred with its reason.
        for step in (60, 70):
            checkpoint_id = queries.record_checkpoint(
                s,
                run_id=run_ids["beta"],
                path=f"/runs/beta/step_{step}",
                name=f"step_{step}",
                step=step,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[TASK])
            if step == 60:
                job = queries.claim_next_job(s, "t:1")
                assert job is not None
                queries.fail_job(s, job_id=job.id, owner="t:1", kind="crash", error="boom", duration_s=1.0)
        scheduling.defer_pending(s, "gpu busy: 3 GiB free, 20 GiB needed", datetime.now(UTC))
        for step, rule, state in (
            (40, "drop_from_best", AlertState.FIRING),
            (20, "robust_z", AlertState.RESOLVED),
        ):
            s.add(
                Alert(
                    fingerprint=fingerprint("alpha", rule, "accuracy", TASK),
                    run_id=run_ids["alpha"],
                    task=TASK,
                    metric="accuracy",
                    rule=rule,
                    severity="warning",
                    state=state,
                    first_step=step,
                    last_step=step,
                    message=f"{rule} at step {step}",
                    resolved_at=datetime.now(UTC) if state is AlertState.RESOLVED else None,
                )
            )


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stored(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stored]:
    """The runs above, stored once per backend; every test only reads them."""
    tmp = tmp_path_factory.mktemp(f"web-{request.param}")

    def build_store(url: str) -> Stored:
        database = upgraded(url)
        try:
            _store(database)
        finally:
            database.dispose()
        return Stored(url, write_config(tmp, url, dataset=write_dataset(tmp / "d.jsonl", 2)))

    if request.param == "sqlite":
        yield build_store(f"sqlite:///{tmp / 'evald.db'}")
    else:
        with fresh_postgres() as url:
            yield build_store(url)


@pytest.fixture(scope="module")
def app(stored: Stored) -> Iterator[Starlette]:
    app = build(load_config(stored.config), environ={})
    yield app
    app.state.web.database.dispose()


@pytest.fixture(scope="module")
def client(app: Starlette) -> TestClient:
    return TestClient(app, raise_server_exceptions=False)


def _all(client: TestClient, path: str) -> list[dict[str, Any]]:
    """Every item of a paged list, following ``next``."""
    items: list[dict[str, Any]] = []
    url: str | None = path
    while url is not None:
        response = client.get(url)
        assert response.status_code == 200, response.text
        body = response.json()
        items.extend(body["items"])
        url = body["next"]
    return items


def _fingerprint(url: str) -> Any:
    """What the database holds: row counts of every table (and, for SQLite, the file's bytes)."""
    database = Database(url, read_only=True)
    try:
        with database.session() as s:
            counts = {
                t.name: s.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables
            }
    finally:
        database.dispose()
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        return counts, hashlib.sha256(path.read_bytes()).hexdigest()
    return counts


def test_runs_list_and_one_run_with_404_naming_the_runs(client: TestClient) -> None:
    runs = _all(client, "/api/v1/runs?limit=1")
    assert [r["name"] for r in runs] == ["alpha", "beta"]
    alpha = runs[0]
    assert (alpha["checkpoints"], alpha["latest_step"], alpha["evaluated_step"], alpha["firing_alerts"]) == (
        5,
        50,
        50,
        1,
    )
    assert client.get("/api/v1/runs/beta").json()["latest_step"] == 70
    missing = client.get("/api/v1/runs/gamma")
    assert missing.status_code == 404
    assert missing.json()["error"] == "no run 'gamma' (runs: alpha, beta)"


def test_results_are_the_cli_rows_paged_in_the_same_order(
    client: TestClient, stored: Stored, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(stored.config), "results", "--format", "json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    # Paging by 3 walks the same rows in the same order as one CLI call prints them.
    assert _all(client, "/api/v1/results?limit=3") == cli
    assert len(cli) == 2 * (len(SERIES["alpha"]) + len(SERIES["beta"]))


def test_results_filtered_by_run_task_metric_and_step_range(client: TestClient) -> None:
    rows = _all(client, f"/api/v1/results?run=alpha&task={TASK}&metric=accuracy&step_min=20&step_max=40")
    assert [(r["step"], r["value"]) for r in rows] == [(20, 0.5), (30, 0.75), (40, 0.5)]
    assert {r["metric"] for r in rows} == {"accuracy"}
    # Filters that exist but match nothing there: an empty page, not an error.
    past = client.get("/api/v1/results?run=beta&metric=accuracy&step_min=60").json()
    assert past["items"] == [] and past["next"] is None
    inverted = client.get("/api/v1/results?step_min=40&step_max=20")
    assert inverted.status_code == 400 and inverted.json()["parameter"] == "step_min"


UNKNOWN_FILTERS = [
    (
        "/api/v1/results?run=alpha&metric=bleu",
        "metric",
        "run 'alpha' has no metric 'bleu' (metrics: accuracy, wall_s)",
    ),
    (
        "/api/v1/results?metric=bleu",
        "metric",
        "no stored result has metric 'bleu' (metrics: accuracy, wall_s)",
    ),
    ("/api/v1/results?task=gsm8k", "task", f"no stored result has task 'gsm8k' (tasks: {TASK})"),
    ("/api/v1/results?run=beta&stage=quick", "stage", "run 'beta' has no stage 'quick' (stages: full)"),
    (
        f"/api/v1/results?run=alpha&task={TASK}&metric=bleu&step_min=20",
        "metric",
        f"run 'alpha' (task '{TASK}') has no metric 'bleu' (metrics: accuracy, wall_s)",
    ),
    (
        "/api/v1/runs/alpha/series?metric=bleu",
        "metric",
        "run 'alpha' has no metric 'bleu' (metrics: accuracy, wall_s)",
    ),
    ("/api/v1/runs/beta/series?task=gsm8k", "task", f"run 'beta' has no task 'gsm8k' (tasks: {TASK})"),
    (
        "/api/v1/runs/beta/series?stage=quick&metric=accuracy",
        "stage",
        "run 'beta' has no stage 'quick' (stages: full)",
    ),
]


@pytest.mark.parametrize(
    ("path", "parameter", "message"), UNKNOWN_FILTERS, ids=[p for p, _, _ in UNKNOWN_FILTERS]
)
def test_an_unknown_task_stage_or_metric_is_a_404_listing_what_exists(
    client: TestClient, path: str, parameter: str, message: str
) -> None:
    response = client.get(path)
    assert response.status_code == 404, response.text
    assert response.json() == {"error": message, "status": 404, "parameter": parameter}


def test_series_refuses_an_inverted_step_range_as_results_does(client: TestClient) -> None:
    for path in ("/api/v1/results", "/api/v1/runs/alpha/series"):
        inverted = client.get(f"{path}?step_min=40&step_max=20")
        assert inverted.status_code == 400, path
        assert inverted.json() == {
            "error": "parameter 'step_min': 40 is above step_max 20",
            "status": 400,
            "parameter": "step_min",
        }
    # Beside it, good ranges still answer: one step, and an open-ended one.
    (one,) = client.get("/api/v1/runs/alpha/series?metric=accuracy&step_min=30&step_max=30").json()["series"]
    assert (one["step"], one["value"]) == ([30], [0.75])
    (tail,) = client.get("/api/v1/runs/alpha/series?metric=accuracy&step_min=40").json()["series"]
    assert tail["step"] == [40, 50]


def test_cli_results_filters_as_the_api_does(
    client: TestClient, stored: Stored, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--config", str(stored.config), "results", "--format", "json"]
    assert main([*base, "--run", "nope"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == "evald: error: no run 'nope' (runs: alpha, beta)"
    assert main([*base, "--run", "alpha", "--metric", "bleu"]) == 1
    assert capsys.readouterr().err.strip() == (
        "evald: error: run 'alpha' has no metric 'bleu' (metrics: accuracy, wall_s)"
    )
    assert main([*base, "--run", "beta", "--stage", "quick"]) == 1
    assert "has no stage 'quick' (stages: full)" in capsys.readouterr().err
    # The step range, both spellings, the same rows as the API's.
    api = _all(client, "/api/v1/results?run=alpha&stage=full&metric=accuracy&step_min=20&step_max=40")
    assert [r["step"] for r in api] == [20, 30, 40]
    for flags in (["--step-min", "20", "--step-max", "40"], ["--steps", "20:40"]):
        assert main([*base, "--run", "alpha", "--stage", "full", "--metric", "accuracy", *flags]) == 0
        assert json.loads(capsys.readouterr().out) == api
    assert main([*base, "--run", "alpha", "--metric", "accuracy", "--steps", "40:"]) == 0
    assert [r["step"] for r in json.loads(capsys.readouterr().out)] == [40, 50]
    # A range past the newest step is an empty list, exit 0 (the filters exist).
    assert main([*base, "--run", "beta", "--steps", "100:"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    for flags, where in (
        (["--steps", "40:20"], "--steps: 40:20 is reversed: the lower step comes first (--steps 20:40)"),
        (["--step-min", "40", "--step-max", "20"], "--step-min: 40 is above --step-max 20: the range"),
        (["--steps", "20-40"], "--steps: '20-40' is not A:B"),
        (["--steps", "1:2", "--step-min", "1"], "--steps: give --steps A:B or --step-min/--step-max"),
        (["--step-min", "-5"], "--step-min: -5 is outside 0..2147483647"),
    ):
        assert main([*base, *flags]) == 2, flags
        assert capsys.readouterr().err.startswith(f"evald: {where}"), flags


def test_latest_is_each_series_at_its_newest_step(client: TestClient) -> None:
    latest = {
        (r["run"], r["metric"]): (r["step"], r["value"]) for r in _all(client, "/api/v1/results/latest")
    }
    assert latest == {
        ("alpha", "accuracy"): (50, 0.6),
        ("alpha", "wall_s"): (50, 50.0),
        ("beta", "accuracy"): (30, 0.4),
        ("beta", "wall_s"): (30, 30.0),
    }


def test_series_are_columnar_with_best_point_and_the_shared_smoothing(client: TestClient) -> None:
    body = client.get("/api/v1/runs/alpha/series?metric=accuracy&smooth=ema:0.6").json()
    assert body["smooth"] == "ema:0.6"
    (series,) = body["series"]
    values = [v for _, v, _ in SERIES["alpha"]]
    assert series["step"] == [s for s, _, _ in SERIES["alpha"]] and series["value"] == values
    assert series["best"] == {"step": 30, "value": 0.75, "checkpoint": "step_30"}
    assert series["smoothed"]["value"] == pytest.approx(parse_smoothing("ema:0.6").apply(values))
    window = client.get("/api/v1/runs/alpha/series?metric=accuracy&smooth=window:3").json()["series"][0]
    assert window["smoothed"]["value"] == pytest.approx(parse_smoothing("window:3").apply(values))
    # Lower is better for wall_s (the registry's direction, as the detectors read it).
    wall = client.get("/api/v1/runs/alpha/series?metric=wall_s").json()["series"][0]
    assert wall["higher_is_better"] is False and wall["best"]["step"] == 10 and wall["smoothed"] is None
    bad = client.get("/api/v1/runs/alpha/series?smooth=ema:2")
    assert bad.status_code == 400 and bad.json()["parameter"] == "smooth"


def test_one_step_has_its_metrics_and_alerts_and_404_names_the_nearest_steps(client: TestClient) -> None:
    body = client.get("/api/v1/runs/alpha/steps/40").json()
    assert {r["metric"]: r["value"] for r in body["results"]} == {"accuracy": 0.5, "wall_s": 40.0}
    assert [(a["rule"], a["state"]) for a in body["alerts"]] == [("drop_from_best", "firing")]
    missing = client.get("/api/v1/runs/alpha/steps/35")
    assert missing.status_code == 404
    assert "nearest steps: 20, 30, 40, 50, 10" not in missing.text and "30, 40" in missing.json()["error"]
    assert client.get("/api/v1/runs/alpha/steps/abc").status_code == 404


def test_samples_with_the_wrong_only_filter_and_problems(client: TestClient) -> None:
    everything = client.get("/api/v1/runs/alpha/steps/20/samples").json()
    assert (everything["stored_samples"], everything["matching_samples"]) == (4, 4)
    assert everything["problems"] == [
        {"where": "d.jsonl:3", "message": "no answer field", "prompt_id": "p9", "index": None}
    ]
    wrong = client.get(f"/api/v1/runs/alpha/steps/20/samples?task={TASK}&wrong_only=true").json()
    assert [s["index"] for s in wrong["items"]] == [2, 3]
    assert all(not s["correct"] for s in wrong["items"])
    paged = client.get("/api/v1/runs/alpha/steps/20/samples?limit=3").json()
    assert len(paged["items"]) == 3 and paged["next_offset"] == 3
    unknown_task = client.get("/api/v1/runs/alpha/steps/20/samples?task=gsm8k")
    assert unknown_task.status_code == 404 and "arith [full]" in unknown_task.json()["error"]
    unknown_step = client.get("/api/v1/runs/beta/steps/20/samples")
    assert unknown_step.status_code == 400 and unknown_step.json()["parameter"] == "task"
    assert client.get(f"/api/v1/runs/beta/steps/20/samples?task={TASK}").status_code == 404


def test_alerts_status_and_jobs(client: TestClient) -> None:
    firing = _all(client, "/api/v1/alerts?state=firing")
    assert [(a["run"], a["rule"], a["step"]) for a in firing] == [("alpha", "drop_from_best", 40)]
    assert len(_all(client, "/api/v1/alerts?run=alpha")) == 2
    status = client.get("/api/v1/status").json()["runs"]
    assert status["beta"]["deferred"][0]["reason"].startswith("gpu busy")
    assert [(p["state"], p["reason"]) for p in status["beta"]["problems"]] == [("failed", "boom")]
    failed = _all(client, "/api/v1/jobs?state=failed")
    assert [(j["run"], j["step"], j["error_kind"]) for j in failed] == [("beta", 60, "crash")]
    assert client.get("/api/v1/changes").json()["version"]


BAD_REQUESTS = [
    ("/api/v1/results?limit=1000000000", 400, "limit"),
    (f"/api/v1/results?limit={MAX_LIMIT + 1}", 400, "limit"),
    ("/api/v1/results?limit=0", 400, "limit"),
    ("/api/v1/results?offset=-1", 400, "offset"),
    ("/api/v1/results?step_min=1e3", 400, "step_min"),
    ("/api/v1/results?step_max=99999999999999999999", 400, "step_max"),
    ("/api/v1/results?limit=%31%30%30%30%30%30", 400, "limit"),
    ("/api/v1/results?limit=--5", 400, "limit"),
    ("/api/v1/results?offset=%C2%B2", 400, "offset"),
    ("/api/v1/results?limit=%205", 400, "limit"),
    ("/api/v1/runs/%00", 400, "run"),
    ("/api/v1/runs/alpha%0Abeta/series", 400, "run"),
    ("/api/v1/runs/%ff/checkpoints", 400, "run"),
    ("/api/v1/runs/alpha/steps/%C2%B2", 404, None),
    ("/api/v1/results?metric=", 400, "metric"),
    ("/api/v1/results?run=%ff%fe", 400, "run"),
    ("/api/v1/results?run=alpha%00", 400, "run"),
    ("/api/v1/results?run=alpha&run=beta", 400, "run"),
    ("/api/v1/results?metrc=accuracy", 400, "metrc"),
    ("/api/v1/results?run=" + "a" * 600, 400, "run"),
    ("/api/v1/results?%=%&&=", 400, "%"),
    ("/api/v1/alerts?state=firing%27%20OR%201%3D1", 400, "state"),
    ("/api/v1/jobs?state=running;DROP%20TABLE%20runs", 400, "state"),
    ("/api/v1/runs/alpha/samples?wrong_only=maybe", 404, None),
    ("/api/v1/runs/alpha/steps/20/samples?wrong_only=maybe", 400, "wrong_only"),
    ("/api/v1/results?run=alpha%27%3B%20DROP%20TABLE%20results%3B--", 404, None),
    ("/api/v1/runs/alpha%27%20OR%20%271%27%3D%271", 404, None),
    # An SQL-looking metric name is a name like any other: none is stored (404 listing the metrics).
    ("/api/v1/results?metric=accuracy%27%20OR%20%271%27%3D%271", 404, None),
    ("/api/v1/runs/alpha/steps/-1", 404, None),
    ("/api/v1/runs/alpha/steps/99999999999999999999999", 404, None),
    ("/static/../../../../etc/passwd", 404, None),
    ("/static/%2e%2e/%2e%2e/%2e%2e/etc/passwd", 404, None),
    ("/static/..%2f..%2f..%2fetc%2fpasswd", 404, None),
    ("/static/%252e%252e/%252e%252e/etc/passwd", 404, None),
    ("/static//etc/passwd", 404, None),
    ("/static/../web/app.py", 404, None),
    ("/static/../../storage/database.py", 404, None),
    ("/api/v1/nothing", 404, None),
]


@pytest.mark.parametrize(("path", "status", "parameter"), BAD_REQUESTS, ids=[p for p, _, _ in BAD_REQUESTS])
def test_bad_input_is_a_4xx_naming_the_parameter_and_leaks_nothing(
    client: TestClient, path: str, status: int, parameter: str | None
) -> None:
    response = client.get(path)
    assert response.status_code == status, response.text
    body = response.text
    for leak in (
        "root:",
        "Traceback",
        "SELECT",
        "sqlalchemy",
        "psycopg",
        "sqlite3",
        "def create_app",
        "/work/",
    ):
        assert leak not in body
    assert response.headers["content-type"] == "application/json"
    assert response.json()["status"] == status
    if parameter is not None:
        assert response.json()["parameter"] == parameter
        assert repr(parameter) in response.json()["error"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_no_route_takes_a_writing_method(client: TestClient, method: str) -> None:
    for path in ("/api/v1/runs", "/api/v1/results", "/api/v1/runs/alpha/steps/20/samples"):
        response = client.request(method, path, content=b"{}")
        assert response.status_code == 405, (method, path)
        assert "read-only" in response.json()["error"]
        # RFC 9110: a 405 says which methods the resource takes.
        assert response.headers["allow"] == "GET, HEAD", (method, path)
    assert client.request(method, "/static/dashboard.js").headers["allow"] == "GET, HEAD"


def test_every_request_above_left_the_database_as_it_was(client: TestClient, stored: Stored) -> None:
    before = _fingerprint(stored.url)
    for path, _, _ in BAD_REQUESTS:
        client.get(path)
    for path in (
        "/api/v1/runs",
        "/api/v1/results",
        "/api/v1/status",
        "/api/v1/runs/alpha/series?smooth=ema:0.9",
    ):
        assert client.get(path).status_code == 200
    for method in ("POST", "DELETE"):
        client.request(method, "/api/v1/runs/alpha")
    assert _fingerprint(stored.url) == before


def test_the_service_engine_cannot_write(app: Starlette, stored: Stored) -> None:
    """The proof: a statement that writes, sent through the very engine the routes use, is refused by the
    database (SQLite opened with mode=ro, PostgreSQL sessions in read-only transactions)."""
    database: Database = app.state.web.database
    assert database.read_only
    for statement in (
        "UPDATE runs SET root = 'x'",
        "DELETE FROM results",
        "INSERT INTO runs (name, root, created_at) VALUES ('evil', '/', CURRENT_TIMESTAMP)",
        "CREATE TABLE evil (x INTEGER)",
    ):
        with pytest.raises(DBAPIError) as refused, database.session() as s:
            s.execute(text(statement))
        message = str(refused.value.orig).lower()
        assert "readonly" in message or "read-only" in message, message
    with database.session() as s:
        assert s.scalar(select(func.count()).select_from(Base.metadata.tables["runs"])) == 2


@pytest.mark.postgres
def test_serves_through_a_role_that_may_only_select(tmp_path: Path) -> None:
    """On PostgreSQL the service also runs under a role granted SELECT and nothing else: it answers, and
    a write through it fails on the grant as well as on the read-only transaction."""
    with fresh_postgres() as url:
        _store(upgraded_dispose(url))
        role = f"evald_reader_{uuid.uuid4().hex[:12]}"
        admin = Database(url)
        try:
            with admin.session() as s:
                s.execute(text(f'CREATE ROLE "{role}" LOGIN'))
                s.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"'))
            reader_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
            config = load_config(
                write_config(tmp_path, reader_url, dataset=write_dataset(tmp_path / "d.jsonl", 2))
            )
            app = build(config, environ={})
            try:
                client = TestClient(app, raise_server_exceptions=False)
                assert [r["name"] for r in client.get("/api/v1/runs").json()["items"]] == ["alpha", "beta"]
                with pytest.raises(DBAPIError), app.state.web.database.session() as s:
                    s.execute(text("SET TRANSACTION READ WRITE"))
                    s.execute(text("DELETE FROM results"))
            finally:
                app.state.web.database.dispose()
        finally:
            with admin.session() as s:
                s.execute(text(f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"'))
                s.execute(text(f'DROP ROLE "{role}"'))
            admin.dispose()


def upgraded_dispose(url: str) -> Database:
    database = upgraded(url)
    database.dispose()
    return database


def _config_with_token(stored: Stored, tmp_path: Path) -> Config:
    text_ = stored.config.read_text() + '\n[web]\ntoken_env = "EVALD_TEST_WEB_TOKEN"\n'
    path = tmp_path / "evald.toml"
    path.write_text(text_)
    return load_config(path)


def test_bearer_token_is_required_for_every_request_when_configured(stored: Stored, tmp_path: Path) -> None:
    config = _config_with_token(stored, tmp_path)
    with pytest.raises(ConfigError) as unset:
        build(config, environ={})
    assert unset.value.source == "web.token_env" and "EVALD_TEST_WEB_TOKEN" in unset.value.problems[0]
    app = build(config, environ={"EVALD_TEST_WEB_TOKEN": "s3cret-token"})
    try:
        client = TestClient(app, raise_server_exceptions=False, follow_redirects=False)
        for path in ("/api/v1/runs", "/api/v1/results?run=alpha", "/static/dashboard.js", "/"):
            assert client.get(path).status_code in (401, 303), path
        refused = client.get("/api/v1/runs", headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        assert "s3cret" not in refused.text
        ok = client.get("/api/v1/runs", headers={"Authorization": "Bearer s3cret-token"})
        assert ok.status_code == 200
        assert client.get("/").headers["location"] == "/login"
        # The browser's way in: the login form sets an HttpOnly cookie that later requests carry.
        assert client.post("/login", data={"token": "nope"}).status_code == 401
        wrong_method = client.put("/login")
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "GET, HEAD, POST"
        login = client.post("/login", data={"token": "s3cret-token"})
        assert login.status_code == 303
        assert "httponly" in login.headers["set-cookie"].lower()
        assert client.get("/api/v1/runs").status_code == 200
    finally:
        app.state.web.database.dispose()


def test_no_token_configured_needs_no_header(stored: Stored) -> None:
    app = create_app(load_config(stored.config), database=Database(stored.url, read_only=True))
    try:
        response = TestClient(app).get("/api/v1/runs")
        assert response.status_code == 200
        assert "default-src 'self'" in response.headers["content-security-policy"]
    finally:
        app.state.web.database.dispose()


def test_compare_is_the_cli_comparison_and_names_a_bad_parameter(
    client: TestClient, stored: Stored, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--config", str(stored.config), "compare", "--run", "alpha", "--run", "beta", "--format", "json"]
    for query, flags in (
        ("", []),
        ("&smooth=ema:0.6&fdr=0.1", ["--smooth", "ema:0.6", "--fdr", "0.1"]),
        ("&metric=accuracy", ["--metric", "accuracy"]),
    ):
        assert main([*base, *flags]) == 0
        cli = json.loads(capsys.readouterr().out)
        response = client.get(f"/api/v1/compare?run_a=alpha&run_b=beta{query}")
        assert response.status_code == 200, response.text
        assert response.json() == cli, query
    body = client.get("/api/v1/compare?run_a=alpha&run_b=beta").json()
    # The matched steps (10 and 30) of both metrics, each row with both runs' values.
    assert sorted({(r["metric"], r["step"]) for r in body["rows"]}) == [
        ("accuracy", 10),
        ("accuracy", 30),
        ("wall_s", 10),
        ("wall_s", 30),
    ]
    at30 = next(r for r in body["rows"] if (r["metric"], r["step"]) == ("accuracy", 30))
    assert (at30["value_a"], at30["value_b"]) == (0.75, 0.4)
    for query, status, parameter in (
        ("run_a=alpha", 400, "run_b"),
        ("run_a=alpha&run_b=gamma", 404, "run_b"),
        ("run_a=gamma&run_b=alpha", 404, "run_a"),
        ("run_a=alpha&run_b=beta&metric=bleu", 404, "metric"),
        ("run_a=alpha&run_b=beta&smooth=ema:2", 400, "smooth"),
        ("run_a=alpha&run_b=beta&fdr=1", 400, "fdr"),
        ("run_a=alpha&run_b=beta&fdr=nan", 400, "fdr"),
        ("run_a=alpha&run_b=beta&run=alpha", 400, "run"),
    ):
        refused = client.get(f"/api/v1/compare?{query}")
        assert refused.status_code == status, (query, refused.text)
        assert refused.json()["parameter"] == parameter, query
    assert (
        "no run 'gamma' (runs: alpha, beta)"
        in client.get("/api/v1/compare?run_a=alpha&run_b=gamma").json()["error"]
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fdr=st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.floats().map(str))
def test_compare_takes_any_fdr_strictly_between_0_and_1_and_refuses_the_rest(
    client: TestClient, fdr: str
) -> None:
    response = client.get("/api/v1/compare", params={"run_a": "alpha", "run_b": "beta", "fdr": fdr})
    plain = re.fullmatch(r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?", fdr) is not None
    if plain and 0 < float(fdr) < 1:
        assert response.status_code == 200, response.text
        assert response.json()["fdr"] == float(fdr)
    else:
        assert response.status_code == 400, response.text
        assert response.json()["parameter"] == "fdr"
