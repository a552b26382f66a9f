"""``GET /metrics``: scraped from a served app on both backends, parsed with prometheus_client's own
parser, and every number checked against the database (read there by the CLI's queries)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update
from starlette.applications import Starlette
from starlette.testclient import TestClient

from daemon.config import load_config
from daemon.web.app import create_app
from daemon.web.metrics import DURATION_BUCKETS
from storage import alerting, outbox, queries
from storage.database import Database
from storage.models import Alert, AlertState, CheckpointState, EvalJob
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
                # The configured run ("toy"): listed from its first checkpoint, before any result.
                run_id = queries.ensure_run(session, "toy", "/toy")
                checkpoint_id = queries.record_checkpoint(
                    session,
                    run_id=run_id,
                    path="/toy/step_5",
                    name="step_5",
                    step=5,
                    epoch=None,
                    layout="hf",
                    state=CheckpointState.READY,
                )
                queries.enqueue_jobs(session, checkpoint_id=checkpoint_id, step=5, tasks=["arith"])
            after = _scrape(client)
            assert _of(after, "evald_jobs")[(("state", "pending"),)] == 1
            assert _of(after, "evald_alerts_firing") == {(("run", "toy"),): 0.0}
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


def _result(database: Database, run: str, step: int, metrics: list[queries.MetricRow], age_s: float) -> None:
    """One succeeded job of ``run`` at ``step``, its results stored ``age_s`` seconds ago."""
    with database.session() as s:
        run_id = queries.ensure_run(s, run, f"/{run}")
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/{run}/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=["arith"])
        job = queries.claim_next_job(s, "h:1")
        assert job is not None
        assert queries.complete_job(
            s, job_id=job.id, owner="h:1", metrics=metrics, samples=[], duration_s=1.0, load_s=0.1
        )
        finished = datetime.now(UTC) - timedelta(seconds=age_s)
        s.execute(update(EvalJob).where(EvalJob.id == job.id).values(finished_at=finished))


def _outbox(database: Database, run: str, endpoint: str, attempts: list[int | None], end: str) -> None:
    """A message for ``endpoint`` tried with these statuses (None: no answer), then left in ``end``."""
    with database.session() as s:
        run_id = queries.ensure_run(s, run, f"/{run}")
        alert = Alert(
            fingerprint=f"{run}-{endpoint}-{len(attempts)}-{end}",
            run_id=run_id,
            task="arith",
            metric="accuracy",
            rule="drop_from_best",
            severity="warning",
            state=AlertState.FIRING,
            message="drop",
        )
        s.add(alert)
        s.flush()
        event = f"evt-{alert.id}-{endpoint}"
        outbox.enqueue(s, alert=alert, endpoints=[endpoint], event_ids=[event], body="{}")
        (message,) = outbox.due(s, endpoint=endpoint, now=datetime.now(UTC) + timedelta(days=1))
        for status in attempts:
            error = None if status is not None else "ConnectError: refused"
            outbox.record_attempt(s, message.id, outbox.Attempt(datetime.now(UTC), 0.1, status, error))
        if end == "delivered":
            outbox.delivered(s, message.id)
        elif end == "failed":
            outbox.give_up(s, message.id, "HTTP 400 5 times")


def test_freshness_webhooks_and_the_run_window(database_url: str, tmp_path: Path) -> None:
    """Per run and task the time of its newest result; webhook failures per endpoint and the outbox by
    state; runs listed: the configured one (old or not) and others with a result inside the window."""
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "d.jsonl", 1))
    config.write_text(
        config.read_text()
        + '\n[[webhooks]]\nname = "quiet"\nurl = "http://127.0.0.1:9/q"\n'
        + "\n[web]\nmetrics_window_secs = 86400\n"
    )
    day = 86400.0
    try:
        _result(database, "toy", 10, [queries.MetricRow("accuracy", 0.5, 10, 0.1)], age_s=30 * day)
        _result(database, "old", 10, [queries.MetricRow("accuracy", 0.9, 10, 0.1)], age_s=2 * day)
        _result(
            database,
            "recent",
            10,
            # A mean over zero samples: no number to export.
            [queries.MetricRow("accuracy", 0.25, 8, 0.1), queries.MetricRow("length_correct", 0.0, 0, None)],
            age_s=60.0,
        )
        _outbox(database, "recent", "ops", [500, None, 200], "delivered")
        _outbox(database, "recent", "ops", [400, 400], "failed")
        _outbox(database, "recent", "ops", [503], "pending")
        _outbox(database, "recent", "chat", [200], "delivered")
        with database.session() as s:
            # The finish times of the newest step's jobs, as the CLI's query reads them.
            stored = {r.run: r.evaluated_at for r in queries.latest_results(s)}
        with TestClient(_app(config, database)) as client:
            response = client.get("/metrics")
            assert response.status_code == 200
            samples = _samples(response.text)
            # The same text through the OpenMetrics parser (what Prometheus negotiates): valid there too.
            om = client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
            names = {f.name for f in openmetrics_families(om.text)}  # type: ignore[no-untyped-call]
            assert names >= {"evald_webhook_failures", "evald_last_result_timestamp_seconds"}
    finally:
        database.dispose()
    stamps = _of(samples, "evald_last_result_timestamp_seconds")
    assert stamps == {
        (("run", "toy"), ("task", "arith")): stored["toy"].timestamp(),
        (("run", "recent"), ("task", "arith")): stored["recent"].timestamp(),
    }
    now = datetime.now(UTC).timestamp()
    assert 30 * day - 120 < now - stamps[(("run", "toy"), ("task", "arith"))] < 30 * day + 120
    assert 0 < now - stamps[(("run", "recent"), ("task", "arith"))] < 600
    # "old" (not configured, newest result 2 days back, window 1 day) is in no run-labelled family.
    assert _of(samples, "evald_metric_value") == {
        (("metric", "accuracy"), ("run", "recent"), ("stage", "full"), ("task", "arith")): 0.25,
        (("metric", "accuracy"), ("run", "toy"), ("stage", "full"), ("task", "arith")): 0.5,
    }
    assert _of(samples, "evald_checkpoint_step") == {(("run", "recent"),): 10.0, (("run", "toy"),): 10.0}
    assert set(_of(samples, "evald_alerts_firing")) == {(("run", "recent"),), (("run", "toy"),)}
    # Failed attempts: ops had 500, no answer, 400, 400, 503; chat none; the configured quiet one 0.
    assert _of(samples, "evald_webhook_failures_total") == {
        (("endpoint", "chat"),): 0.0,
        (("endpoint", "ops"),): 5.0,
        (("endpoint", "quiet"),): 0.0,
    }
    messages = _of(samples, "evald_webhook_messages")
    assert {
        state: messages[(("endpoint", "ops"), ("state", state))]
        for state in ("pending", "delivered", "failed", "disabled")
    } == {"pending": 1.0, "delivered": 1.0, "failed": 1.0, "disabled": 0.0}
    assert messages[(("endpoint", "quiet"), ("state", "pending"))] == 0.0
    help_text = next(
        line for line in response.text.splitlines() if line.startswith("# HELP evald_metric_value")
    )
    assert "own unit" in help_text and "seconds for *_s" in help_text


def test_window_zero_lists_only_the_configured_runs(database_url: str, tmp_path: Path) -> None:
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "d.jsonl", 1))
    config.write_text(config.read_text() + "\n[web]\nmetrics_window_secs = 0\n")
    try:
        _result(database, "toy", 10, [queries.MetricRow("accuracy", 0.5, 10, 0.1)], age_s=5.0)
        _result(database, "other", 10, [queries.MetricRow("accuracy", 0.7, 10, 0.1)], age_s=5.0)
        with TestClient(_app(config, database)) as client:
            samples = _scrape(client)
    finally:
        database.dispose()
    assert {dict(k)["run"] for k in _of(samples, "evald_metric_value")} == {"toy"}
    assert set(_of(samples, "evald_last_result_timestamp_seconds")) == {(("run", "toy"), ("task", "arith"))}
