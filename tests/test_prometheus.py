"""``GET /metrics``: scraped from a served app on both backends, parsed with prometheus_client's own
parser, and every number checked against the database (read there by the CLI's queries)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.testclient import TestClient

from daemon.config import load_config
from daemon.web.app import create_app
from daemon.web.metrics import DURATION_BUCKETS
from storage import alerting, queries
from storage.database import Database
from storage.models import CheckpointState
from tests import surface_data
from tests.harness import upgraded, write_config, write_dataset
from tests.surface_data import Stored

surfaces = surface_data.surfaces_fixture()

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def stored_db(surfaces: Stored) -> Iterator[Database]:
    found = Database(surfaces.url)
    yield found
    found.dispose()


def _app(config: Path, database: Database) -> Starlette:
    return create_app(load_config(config), database=database)


@pytest.fixture(scope="module")
def client(surfaces: Stored) -> Iterator[TestClient]:
    # Served as `evald serve` serves it: the whole app, on a read-only engine.
    database = Database(surfaces.url, read_only=True)
    try:
        with TestClient(_app(Path(surfaces.config), database)) as served:
            yield served
    finally:
        database.dispose()


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _scrape(client: TestClient) -> Samples:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return _samples(response.text)


def _of(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (metric, labels), value in samples.items() if metric == name}


def test_metric_values_are_the_latest_stored(client: TestClient, stored_db: Database) -> None:
    with stored_db.session() as session:
        rows = queries.result_rows(session)
    newest: dict[tuple[str, str, str, str], tuple[int, float]] = {}
    for row in rows:
        key = (row.run, row.task, row.stage, row.metric)
        assert row.step is not None
        if key not in newest or row.step > newest[key][0]:
            newest[key] = (row.step, row.value)
    want = {
        (("metric", m), ("run", r), ("stage", st), ("task", t)): value
        for (r, t, st, m), (_, value) in newest.items()
    }
    got = _of(_scrape(client), "evald_metric_value")
    assert got == want
    # The seeded numbers, by hand: run a's last full accuracy (step 40) and b's (step 50).
    assert got[(("metric", "accuracy"), ("run", "a"), ("stage", "full"), ("task", "arith"))] == 0.45
    assert got[(("metric", "accuracy"), ("run", "b"), ("stage", "full"), ("task", "arith"))] == 0.7
    assert got[(("metric", "accuracy"), ("run", "a"), ("stage", "quick"), ("task", "arith"))] == 0.3


def test_steps_queue_and_alerts(client: TestClient, stored_db: Database) -> None:
    samples = _scrape(client)
    assert _of(samples, "evald_checkpoint_step") == {(("run", "a"),): 40.0, (("run", "b"),): 50.0}
    with stored_db.session() as session:
        jobs = queries.job_rows(session)
        alerts = alerting.alert_rows(session, state="firing")
    states = ("pending", "deferred", "running", "succeeded", "failed", "skipped")
    want_jobs = {(("state", s),): float(sum(1 for j in jobs if j.state == s)) for s in states}
    assert _of(samples, "evald_jobs") == want_jobs
    assert want_jobs[(("state", "succeeded"),)] == 10 and want_jobs[(("state", "deferred"),)] == 1
    assert want_jobs[(("state", "pending"),)] == 1 and want_jobs[(("state", "failed"),)] == 1
    assert _of(samples, "evald_alerts_firing") == {
        (("run", "a"),): float(sum(1 for a in alerts if a.run == "a")),
        (("run", "b"),): 0.0,
    }
    assert _of(samples, "evald_alerts_firing")[(("run", "a"),)] == 2


def test_job_durations_histogram(client: TestClient) -> None:
    samples = _scrape(client)
    for state, durations in (("succeeded", surface_data.DURATIONS), ("failed", [surface_data.FAILED_S])):
        labels = (("state", state), ("task", "arith"))
        assert samples[("evald_job_duration_seconds_count", labels)] == len(durations)
        assert samples[("evald_job_duration_seconds_sum", labels)] == pytest.approx(sum(durations))
        for bound in DURATION_BUCKETS:
            key = ("evald_job_duration_seconds_bucket", (("le", f"{float(bound)}"), *labels))
            assert samples[key] == sum(1 for d in durations if d <= bound), (state, bound)
        inf = ("evald_job_duration_seconds_bucket", (("le", "+Inf"), *labels))
        assert samples[inf] == len(durations)
    # By hand (succeeded): 0.2, 0.3, 0.7 within 1 s; 30 s exactly on its bound; 200 s alone past 120.
    succeeded = (("state", "succeeded"), ("task", "arith"))
    buckets = {
        b: samples[("evald_job_duration_seconds_bucket", (("le", f"{float(b)}"), *succeeded))]
        for b in (1, 30, 120, 300)
    }
    assert buckets == {1: 3, 30: 9, 120: 9, 300: 10}


def test_openmetrics_when_asked(client: TestClient) -> None:
    response = client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")


def test_a_scrape_reads_the_database_each_time(database_url: str, tmp_path: Path) -> None:
    # No second copy of state: what is stored after one scrape shows in the next.
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "d.jsonl", 1))
    try:
        with TestClient(_app(config, database)) as client:
            empty = _scrape(client)
            assert _of(empty, "evald_jobs")[(("state", "pending"),)] == 0
            assert _of(empty, "evald_metric_value") == {} and _of(empty, "evald_alerts_firing") == {}
            with database.session() as session:
                run_id = queries.ensure_run(session, "c", "/c")
                checkpoint_id = queries.record_checkpoint(
                    session,
                    run_id=run_id,
                    path="/c/step_5",
                    name="step_5",
                    step=5,
                    epoch=None,
                    layout="hf",
                    state=CheckpointState.READY,
                )
                queries.enqueue_jobs(session, checkpoint_id=checkpoint_id, step=5, tasks=["arith"])
            after = _scrape(client)
            assert _of(after, "evald_jobs")[(("state", "pending"),)] == 1
            assert _of(after, "evald_alerts_firing") == {(("run", "c"),): 0.0}
    finally:
        database.dispose()


def test_unreachable_database_is_503_in_one_line(surfaces: Stored) -> None:
    database = Database("postgresql+psycopg://postgres@127.0.0.1:1/evald?connect_timeout=2")
    try:
        with TestClient(_app(Path(surfaces.config), database)) as client:
            response = client.get("/metrics")
    finally:
        database.dispose()
    assert response.status_code == 503
    assert response.text.startswith("evald: cannot read the database (")
    # One line, and nothing of the connection (host, port, database) leaks to the scraper.
    assert (
        response.text.count("\n") == 1 and "127.0.0.1" not in response.text and "evald?" not in response.text
    )


def test_the_token_guards_metrics_too(surfaces: Stored) -> None:
    database = Database(surfaces.url, read_only=True)
    try:
        app = create_app(load_config(Path(surfaces.config)), database=database, token="s3cret-token")
        with TestClient(app) as client:
            refused = client.get("/metrics")
            assert refused.status_code == 401 and "evald_" not in refused.text
            assert client.get("/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
            allowed = client.get("/metrics", headers={"authorization": "Bearer s3cret-token"})
            assert allowed.status_code == 200
            assert _of(_samples(allowed.text), "evald_checkpoint_step") == {
                (("run", "a"),): 40.0,
                (("run", "b"),): 50.0,
            }
    finally:
        database.dispose()
