"""MLflow as a tracker, against a real ``mlflow server`` on loopback (tests/mlflowserver.py).

Results are stored the way the runner stores them (the job completed, then the alerter's ``after_result``
in the same transaction, which queues the tracker's message), delivered by the tracker relay's threads,
and read back through MLflow's own client: every value of ``evald results`` at its step, once.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy import func, select, update

from daemon.alerts.lifecycle import Alerter
from daemon.cli import main
from daemon.config import Config, load_config
from daemon.delivery.relay import Relay
from daemon.delivery.report import destinations
from daemon.delivery.sinks.mlflow_tables import SAMPLE_COLUMNS, listed_tables
from daemon.delivery.trackers import tracker_routes
from daemon.errors import ConfigError
from storage import alerting, queries
from storage.database import Database
from storage.models import CheckpointState, Delivery, OutboxMessage, OutboxState, utcnow
from storage.outbox import enqueue_message
from tests.harness import upgraded, wait_for, write_config, write_dataset
from tests.mlflowserver import (
    ADMIN,
    Gate,
    MlflowServer,
    StallingProxy,
    mlflow_auth_server_fixture,
    mlflow_server_fixture,
    require_mlflow,
)

mlflow_server = mlflow_server_fixture()
mlflow_auth_server = mlflow_auth_server_fixture()

RUN = "toy"
TASK = "arith"


@dataclass
class Setup:
    database: Database
    config: Config
    config_path: Path
    alerter: Alerter
    run_id: int
    experiment: str
    uri: str


def _setup(
    tmp_path: Path,
    uri: str,
    *,
    extra: str = "",
    store_url: str | None = None,
    kind: str = "mlflow",
    timeout_secs: float = 3,
    after: str = "",
    experiment: str | None = None,
) -> Setup:
    url = store_url or f"sqlite:///{tmp_path / 'evald.db'}"
    database = upgraded(url)
    dataset = write_dataset(tmp_path / "d.jsonl", 2)
    path = write_config(tmp_path, url, dataset=dataset)
    experiment = experiment or f"exp-{uuid.uuid4().hex[:8]}"
    with path.open("a") as out:
        out.write(
            f"""
[[trackers]]
kind = "{kind}"
{f'tracking_uri = "{uri}"' if uri else ""}
experiment = "{experiment}"
max_backoff_secs = 0.5
timeout_secs = {timeout_secs}
{extra}
{after}
"""
        )
    config = load_config(path)
    with database.session() as s:
        run_id = queries.ensure_run(s, RUN, str(config.runs[0].root))
    return Setup(database, config, path, Alerter(config), run_id, experiment, uri)


def store_result(
    setup: Setup,
    step: int,
    metrics: list[queries.MetricRow],
    stage: str = "full",
    samples: list[queries.SampleRow] | None = None,
) -> int:
    """One evaluation stored as the runner stores it: the result and the alerter's work in one
    transaction, ``after_commit`` after it."""
    with setup.database.session() as s:
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=setup.run_id,
            path=f"{setup.config.runs[0].root}/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=[TASK], stage=stage)
        job = queries.claim_next_job(s, "h:1")
        assert job is not None and job.step == step
        assert queries.complete_job(
            s, job_id=job.id, owner="h:1", metrics=metrics, samples=samples or [], duration_s=1.0, load_s=0.1
        )
        setup.alerter.after_result(s, job)
    setup.alerter.after_commit()
    return job.id


def metrics_at(step: int) -> list[queries.MetricRow]:
    return [
        queries.MetricRow("accuracy", round(step / 1000, 4), 100, 0.05),
        queries.MetricRow("response_length", 10.0 + step, 100, 1.5),
    ]


def sample_at(step: int) -> queries.SampleRow:
    return queries.SampleRow(
        index=0,
        prompt_id=f"arith/{step}",
        prompt=f"{step}+1=",
        response=str(step + 1),
        extracted=str(step + 1),
        reference=str(step + 1),
        correct=True,
        tokens=3,
        truncated=False,
    )


def outbox(database: Database) -> dict[str, int]:
    with database.session() as s:
        rows = s.execute(
            select(OutboxMessage.state, func.count())
            .where(OutboxMessage.endpoint.startswith("tracker:"))
            .group_by(OutboxMessage.state)
        ).all()
    return {state.value: int(n) for state, n in rows}


def redeliver(database: Database) -> None:
    """As after a crash between the tracker taking the messages and the outbox's mark: all pending again,
    due now."""
    with database.session() as s:
        s.execute(
            update(OutboxMessage).values(
                state=OutboxState.PENDING, delivered_at=None, next_attempt_at=utcnow()
            )
        )


def failed_attempts(database: Database) -> int:
    with database.session() as s:
        return int(
            s.scalar(select(func.count()).select_from(Delivery).where(Delivery.error.is_not(None))) or 0
        )


def delivered(database: Database, n: int) -> bool:
    return outbox(database).get("delivered", 0) == n


def mlflow_run(setup: Setup) -> Any:
    from mlflow.tracking import MlflowClient

    # The sink sets MLflow's request timeout for the whole process (1 s in the timeout tests); the test's
    # own reads take a long one, so that a loaded machine does not fail them.
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "120"
    client = MlflowClient(setup.uri)
    experiment = client.get_experiment_by_name(setup.experiment)
    assert experiment is not None, f"experiment {setup.experiment} was not created"
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, f"one own run per evald run, found {len(runs)}"
    return client, runs[0]


def evaluation_files(setup: Setup) -> list[dict[str, Any]]:
    """Every evaluation's file on the run (``evald/evaluations/``), read back through MLflow's client."""
    import tempfile

    import mlflow.artifacts

    _, run = mlflow_run(setup)
    with tempfile.TemporaryDirectory() as folder:
        got = Path(
            mlflow.artifacts.download_artifacts(
                run_id=run.info.run_id,
                artifact_path="evald/evaluations",
                tracking_uri=setup.uri,
                dst_path=folder,
            )
        )
        return [json.loads(p.read_text()) for p in sorted(got.rglob("*.json"))]


def alert_files(setup: Setup) -> dict[int, dict[str, Any]]:
    """Each alert's file on the run (``evald/alerts/``: its latest event), by alert id."""
    import tempfile

    import mlflow.artifacts

    _, run = mlflow_run(setup)
    with tempfile.TemporaryDirectory() as folder:
        got = Path(
            mlflow.artifacts.download_artifacts(
                run_id=run.info.run_id, artifact_path="evald/alerts", tracking_uri=setup.uri, dst_path=folder
            )
        )
        return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in got.glob("alert_*.json")}


#: The tags evald sets on a run, whatever the number of evaluations and alerts (an own run's also says
#: which run root it is of).
EVALD_TAGS = {"evald.run", "evald.root", "evald.last_step", "evald.alerts.firing", "evald.results"}


def assert_equal_to_results(setup: Setup) -> int:
    """Every value ``evald results`` lists in MLflow at its step, exactly once, one metric key per metric
    (stderr and n in the evaluation's file, with its checkpoint); a bounded set of evald's tags."""
    client, run = mlflow_run(setup)
    with setup.database.session() as s:
        rows = queries.result_rows(s, run=RUN)
    assert rows
    expected: dict[str, list[tuple[int, float]]] = {}
    records: dict[tuple[str, str, int], list[tuple[float, float | None, int | None]]] = {}
    for row in rows:
        assert row.step is not None
        base = f"eval/{row.task}" if row.stage == "full" else f"eval/{row.task}/{row.stage}"
        expected.setdefault(f"{base}/{row.metric}", []).append((row.step, row.value))
        records.setdefault((row.task, row.stage, row.step), []).append((row.value, row.stderr, row.n))
    assert set(run.data.metrics) == set(expected)
    for key, points in expected.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == sorted(points), key
    files = evaluation_files(setup)
    found: dict[tuple[str, str, int], list[tuple[float, float | None, int | None]]] = {}
    for f in files:
        assert f["checkpoint_path"].endswith(f"step_{f['step']}"), f
        found.setdefault((f["task"], f["stage"], f["step"]), []).extend(
            (m["value"], m["stderr"], m["n"]) for m in f["metrics"].values()
        )
    assert {k: sorted(v) for k, v in found.items()} == {k: sorted(v) for k, v in records.items()}
    assert {k for k in run.data.tags if k.startswith("evald.")} <= EVALD_TAGS
    assert run.data.tags["evald.last_step"] == str(max(row.step for row in rows if row.step is not None))
    return len(rows)


@pytest.fixture
def relay_for() -> Iterator[Any]:
    relays: list[Relay] = []

    def start(setup: Setup, environ: dict[str, str] | None = None) -> Relay:
        relay = Relay(setup.database, tracker_routes(setup.config.trackers, environ or {})).start()
        relays.append(relay)
        # What the service does: the alerter's after_commit wakes the relay.
        setup.alerter._wake = relay.wake
        return relay

    yield start
    for relay in relays:
        relay.stop()


def test_results_read_back_equal_evald_results_once_each(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"')
    relay_for(setup)
    # Out of order (a late checkpoint), and a quick-stage value beside the full one at one step.
    steps = [10, 30, 20, 40]
    for step in steps:
        store_result(setup, step, metrics_at(step))
    store_result(setup, 40, [queries.MetricRow("accuracy", 0.03, 20, 0.1)], stage="quick")
    wait_for(lambda: delivered(setup.database, 5), 60, "5 tracker messages delivered")
    assert assert_equal_to_results(setup) == 9
    _, run = mlflow_run(setup)
    # One file per evaluation, a bounded set of tags (not one per evaluation).
    assert sorted(f["step"] for f in evaluation_files(setup)) == [10, 20, 30, 40, 40]
    assert {k for k in run.data.tags if k.startswith("evald.")} == EVALD_TAGS
    assert json.loads(run.data.tags["evald.alerts.firing"]) == {"count": 0, "alerts": {}}
    assert run.data.tags["evald.run"] == RUN
    assert run.info.run_name == f"evald-{RUN}"
    # What the demo prints when a tracker is configured.
    (line,) = destinations(setup.database, setup.config.trackers)
    assert line == (
        f"results also went to mlflow: MLflow {setup.uri}, experiment {setup.experiment!r} (own run): "
        "5 of 5 evaluation(s) delivered"
    )


def test_server_down_during_results_then_back_delivers_all_once(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    gate = Gate(mlflow_server.port)
    setup = _setup(tmp_path, gate.uri, extra='attach = "own"')
    try:
        relay_for(setup)
        store_result(setup, 10, metrics_at(10))
        wait_for(lambda: delivered(setup.database, 1), 60, "the first message delivered")
        gate.close()
        for step in (20, 30, 40):
            store_result(setup, step, metrics_at(step))
        # Stored while the server is away: nothing is lost, each is retried (attempts recorded).
        wait_for(lambda: failed_attempts(setup.database) or None, 30, "a failed attempt recorded")
        assert outbox(setup.database) == {"delivered": 1, "pending": 3}
        gate.open()
        wait_for(lambda: delivered(setup.database, 4), 60, "all 4 delivered after the outage")
        assert assert_equal_to_results(setup) == 8
    finally:
        gate.close()


def test_a_run_read_that_times_out_is_retried_and_the_result_delivered_once(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    # The run is created, then reading its delivery tags times out (a server too busy to answer in time):
    # the next attempt finds the run again by its tag and delivers, instead of failing for ever.
    proxy = StallingProxy(mlflow_server.port)
    proxy.stall("/runs/get", times=1, seconds=3)
    setup = _setup(tmp_path, proxy.uri, extra='attach = "own"', timeout_secs=1)
    try:
        relay_for(setup)
        store_result(setup, 10, metrics_at(10))
        wait_for(lambda: delivered(setup.database, 1), 60, "the message delivered after the timeout")
        assert proxy.stalled == 1
        assert failed_attempts(setup.database) >= 1
        assert assert_equal_to_results(setup) == 2
    finally:
        proxy.close()


def test_a_redelivery_after_a_crash_logs_nothing_twice(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"')
    relay = relay_for(setup)
    for step in (10, 20):
        store_result(setup, step, metrics_at(step))
    wait_for(lambda: delivered(setup.database, 2), 60, "2 delivered")
    relay.stop()
    # The daemon died after MLflow took the batch and before the outbox said so: both sent again by a
    # new relay (a new sink: nothing remembered in memory).
    redeliver(setup.database)
    relay_for(setup)
    wait_for(lambda: delivered(setup.database, 2), 60, "2 delivered again")
    assert assert_equal_to_results(setup) == 4


def test_backfill_twice_logs_nothing_twice(
    tmp_path: Path, mlflow_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"')
    # Stored before any tracker was configured: nothing in the outbox.
    setup.alerter = Alerter(setup.config.model_copy(update={"trackers": ()}))
    for step in (10, 20, 30):
        store_result(setup, step, metrics_at(step))
    assert outbox(setup.database) == {}
    assert main(["--config", str(setup.config_path), "export", "mlflow", "--run", RUN]) == 0
    first = capsys.readouterr().out
    assert "3 sent" in first, first
    assert main(["--config", str(setup.config_path), "export", "mlflow", "--run", RUN]) == 0
    second = capsys.readouterr().out
    assert "0 sent" in second and "3 already there" in second, second
    assert assert_equal_to_results(setup) == 6


def test_trainer_run_attached_and_a_missing_one_falls_back(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    require_mlflow()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    trainer_exp = client.create_experiment(f"trainer-{uuid.uuid4().hex[:8]}")
    trainer = client.create_run(trainer_exp, run_name="grpo")
    client.log_metric(trainer.info.run_id, "reward", 0.5, step=10)
    setup = _setup(tmp_path, mlflow_server.uri, extra=f'run_ids = {{ toy = "{trainer.info.run_id}" }}')
    relay_for(setup)
    store_result(setup, 10, metrics_at(10))
    wait_for(lambda: delivered(setup.database, 1), 60, "delivered to the trainer's run")
    run = client.get_run(trainer.info.run_id)
    assert set(run.data.metrics) >= {"reward", "eval/arith/accuracy"}
    assert [m.step for m in client.get_metric_history(trainer.info.run_id, "eval/arith/accuracy")] == [10]

    gone = tmp_path / "gone"
    gone.mkdir()
    missing = _setup(gone, mlflow_server.uri, extra='run_ids = { toy = "0123456789abcdef0123456789abcdef" }')
    with structlog.testing.capture_logs() as logs:
        relay_for(missing)
        store_result(missing, 10, metrics_at(10))
        wait_for(lambda: delivered(missing.database, 1), 60, "delivered to an own run")
    said = [e for e in logs if e["event"] == "tracker.trainer_run_missing"]
    assert len(said) == 1, logs
    assert assert_equal_to_results(missing) == 2


def test_a_deleted_trainer_run_falls_back_to_an_own_run_and_says_so(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    trainer = client.create_run(client.create_experiment(f"trainer-{uuid.uuid4().hex[:8]}"), run_name="grpo")
    client.delete_run(trainer.info.run_id)
    setup = _setup(tmp_path, mlflow_server.uri, extra=f'run_ids = {{ toy = "{trainer.info.run_id}" }}')
    with structlog.testing.capture_logs() as logs:
        relay_for(setup)
        store_result(setup, 10, metrics_at(10))
        wait_for(lambda: delivered(setup.database, 1), 60, "delivered to an own run")
    (said,) = [e for e in logs if e["event"] == "tracker.trainer_run_missing"]
    assert said["trainer_run"] == trainer.info.run_id and "deleted" in said["detail"], said
    assert client.get_run(trainer.info.run_id).data.metrics == {}
    assert assert_equal_to_results(setup) == 2


def test_sample_tables_are_mlflow_tables_beside_the_trainers_own_once_each(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "120"
    # MlflowClient.load_table searches through MLflow's global client: this server.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    client = MlflowClient(mlflow_server.uri)
    # The trainer's experiment keeps its artifacts in a folder (not the server's proxy), and the trainer
    # logged a table of its own: evald's tables are listed beside it, the trainer's entry kept.
    artifacts = tmp_path / "trainer-artifacts"
    experiment = client.create_experiment(f"trainer-{uuid.uuid4().hex[:8]}", artifact_location=str(artifacts))
    trainer = client.create_run(experiment, run_name="grpo")
    client.log_table(trainer.info.run_id, {"prompt": ["p"], "reward": [0.5]}, "rollouts/step_1.json")
    setup = _setup(tmp_path, mlflow_server.uri, extra=f'run_ids = {{ toy = "{trainer.info.run_id}" }}')
    relay = relay_for(setup)
    for step in (10, 20):
        store_result(setup, step, metrics_at(step), samples=[sample_at(step)])
    store_result(setup, 20, metrics_at(20), stage="quick", samples=[sample_at(20)])
    wait_for(lambda: delivered(setup.database, 3), 60, "3 delivered")
    relay.stop()
    # Sent again (a crash before the outbox's mark): the tables overwritten, not doubled, listed once.
    redeliver(setup.database)
    relay_for(setup)
    wait_for(lambda: delivered(setup.database, 3), 60, "3 delivered again")

    def table(path: str) -> list[list[str]]:
        frame = client.load_table(experiment, path, run_ids=[trainer.info.run_id])
        return as_text(frame.to_dict(orient="split")["data"])

    for step, stage, path in (
        (10, "full", f"evald/samples/{TASK}/step_000000010.json"),
        (20, "full", f"evald/samples/{TASK}/step_000000020.json"),
        (20, "quick", f"evald/samples/{TASK}/quick/step_000000020.json"),
    ):
        assert table(path) == expected_rows(setup, step, stage), path
        # The file itself: MLflow's table JSON, the values as evald stored them.
        stored = json.loads(next(artifacts.rglob(path)).read_text())
        assert stored == {"columns": list(SAMPLE_COLUMNS), "data": [expected_row(setup, step, stage)]}
    listed = json.loads(client.get_run(trainer.info.run_id).data.tags["mlflow.loggedArtifacts"])
    assert listed == [
        {"path": "rollouts/step_1.json", "type": "table"},
        *(
            {"path": p, "type": "table"}
            for p in (
                f"evald/samples/{TASK}/step_000000010.json",
                f"evald/samples/{TASK}/step_000000020.json",
                f"evald/samples/{TASK}/quick/step_000000020.json",
            )
        ),
    ], listed
    assert table("rollouts/step_1.json") == [["p", "0.5"]]
    assert sorted(p.name for p in artifacts.rglob("step_*.json") if "evaluations" not in p.parts) == [
        "step_000000010.json",
        "step_000000020.json",
        "step_000000020.json",
        "step_1.json",
    ]


def test_the_table_list_keeps_the_trainers_entries_and_evalds_newest_within_the_tag_size() -> None:
    trainer = [{"path": "rollouts/a.json", "type": "table"}]
    paths = [f"evald/samples/t/step_{i:09d}.json" for i in range(200)]
    value = listed_tables(json.dumps(trainer), paths, 5000)
    assert value is not None and len(value) <= 5000
    listed = json.loads(value)
    assert listed[0] == trainer[0]
    kept = [e["path"] for e in listed[1:]]
    assert kept == paths[-len(kept) :] and 40 < len(kept) < 200, len(kept)
    # Nothing new: nothing to set.
    assert listed_tables(value, paths[-1:], 5000) is None
    # A value that is not a list is the trainer's own business: never overwritten.
    with pytest.raises(ValueError):
        listed_tables('{"not": "a list"}', paths, 5000)


def test_a_missing_library_is_a_config_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # find_spec answers None for a module set to None in sys.modules: mlflow as if not installed.
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigError) as raised:
        _setup(tmp_path, "http://127.0.0.1:1")
    text = str(raised.value)
    assert "trackers[0]" in text and "pip install 'evald[mlflow]'" in text, text


def test_tracker_config_errors_name_the_field(tmp_path: Path) -> None:
    for extra, expected in (
        ("colour = 1", "trackers[0].colour: unknown field"),
        ('token_env = "not a name"', "trackers[0].token_env"),
        ('runs = ["nope"]', "trackers[0].runs[0]: unknown run 'nope'"),
        ('trainer_run_name = ""', "trackers[0].trainer_run_name"),
        ("trainer_tags = { team = 1 }", "trackers[0].trainer_tags.team"),
    ):
        folder = tmp_path / uuid.uuid4().hex[:6]
        folder.mkdir()
        with pytest.raises(ConfigError) as raised:
            _setup(folder, "http://127.0.0.1:1", extra=extra)
        assert expected in str(raised.value), str(raised.value)
    folder = tmp_path / "wandb"
    folder.mkdir()
    with pytest.raises(ConfigError) as raised:
        _setup(folder, "", kind="wandb", extra='project = "p"\nmode = "offline"\ntrainer_run_name = "x"')
    assert "trackers[0]: trainer_run_name and trainer_tags find an MLflow run" in str(raised.value), (
        raised.value
    )
    # Beside them, the good ones load.
    folder = tmp_path / "good"
    folder.mkdir()
    good = _setup(
        folder, "http://127.0.0.1:1", extra='trainer_run_name = "{run}-grpo"\ntrainer_tags = { a = "b" }'
    )
    assert (good.config.trackers[0].trainer_run_name, good.config.trackers[0].trainer_tags) == (
        "{run}-grpo",
        {"a": "b"},
    )


@contextlib.contextmanager
def admin_env(uri: str) -> Iterator[Any]:
    """MLflow's own client as the basic-auth server's admin, for the test's reads: the credentials are in
    the environment only inside, never while a sink works (a sink must not need them there)."""
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "120"
    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = ADMIN
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        yield MlflowClient(uri)
    finally:
        for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI"):
            del os.environ[name]


def sample_tables(client: Any, setup: Setup, steps: list[int], stage: str = "") -> dict[int, list[Any]]:
    """Each step's sample table as MLflow's own ``load_table`` reads it (it finds a table by the run's
    ``mlflow.loggedArtifacts`` tag, as the UI's table view does), by step: the rows as text (pandas reads
    ``"21"`` as a number)."""
    _, run = mlflow_run(setup)
    tables = {}
    for step in steps:
        frame = client.load_table(
            run.info.experiment_id,
            f"evald/samples/{TASK}{stage}/step_{step:09d}.json",
            run_ids=[run.info.run_id],
        )
        assert list(frame.columns) == list(SAMPLE_COLUMNS)
        tables[step] = as_text(frame.to_dict(orient="split")["data"])
    return tables


def as_text(rows: list[list[Any]]) -> list[list[str]]:
    return [[str(v) for v in row] for row in rows]


def expected_row(setup: Setup, step: int, stage: str = "full") -> list[Any]:
    sample = sample_at(step)
    path = f"{setup.config.runs[0].root}/step_{step}"
    return [step, stage, path, sample.prompt, sample.response, sample.reference, "correct"]


def expected_rows(setup: Setup, step: int, stage: str = "full") -> list[list[str]]:
    return as_text([expected_row(setup, step, stage)])


@pytest.mark.long
def test_wrong_credentials_pause_the_sink_with_one_line_and_evaluation_goes_on(
    tmp_path: Path, mlflow_auth_server: MlflowServer, relay_for: Any
) -> None:
    # Two trackers on one basic-auth server: one whose runs' artifacts the server proxies
    # (``mlflow-artifacts:``, its default), one whose experiment keeps them in a folder of their own
    # (as ``mlflow server --no-serve-artifacts`` gives every experiment): there the sink writes the
    # artifacts itself and must still ask the server, for the run and its table list, with its own
    # credentials (the bug: a bare MlflowClient was refused for ever, the password fixed or not).
    extra = 'attach = "own"\nuser_env = "EVALD_T_USER"\ntoken_env = "EVALD_T_PASS"\npause_secs = 0.5'
    setups = []
    for name in ("proxied", "direct"):
        folder = tmp_path / name
        folder.mkdir()
        # The basic-auth server hashes the password at every request: seconds on two busy cores.
        setups.append(_setup(folder, mlflow_auth_server.uri, extra=extra, timeout_secs=60))
    direct = setups[1]
    direct_artifacts = tmp_path / "direct-artifacts"
    with admin_env(mlflow_auth_server.uri) as client:
        client.create_experiment(direct.experiment, artifact_location=str(direct_artifacts))
    with structlog.testing.capture_logs() as logs:
        relays = [relay_for(s, {"EVALD_T_USER": ADMIN[0], "EVALD_T_PASS": "wrong"}) for s in setups]
        for setup in setups:
            for step in (10, 20):
                store_result(setup, step, metrics_at(step), samples=[sample_at(step)])
        # Paused, tried again after each pause, refused each time: still one line per tracker.
        for database in [s.database for s in setups]:
            wait_for(lambda: failed_attempts(database) >= 3 or None, 60, "3 refused attempts")  # noqa: B023
        for relay in relays:
            relay.stop()
    paused = [e for e in logs if e["event"] == "tracker.paused"]
    assert len(paused) == 2, paused
    assert all("credentials refused (HTTP 401)" in e["error"] for e in paused), paused
    assert "wrong" not in json.dumps(logs, default=str), "the password must not be logged"
    for setup in setups:
        # Evaluation went on: both results stored, their messages waiting, none given up.
        with setup.database.session() as s:
            assert len(queries.result_rows(s, run=RUN)) == 4
        assert outbox(setup.database) == {"pending": 2}
    # The credential fixed (a reload builds new relays with the new environment): everything delivered,
    # the sample tables included, once.
    for setup in setups:
        relay_for(setup, {"EVALD_T_USER": ADMIN[0], "EVALD_T_PASS": ADMIN[1]})
    for database in [s.database for s in setups]:
        wait_for(lambda: delivered(database, 2), 240, "2 delivered with the right password")  # noqa: B023
    with admin_env(mlflow_auth_server.uri) as client:
        for setup in setups:
            setup.uri = mlflow_auth_server.uri
            assert assert_equal_to_results(setup) == 4
            tables = sample_tables(client, setup, [10, 20])
            assert tables == {step: expected_rows(setup, step) for step in (10, 20)}, tables
        _, run = mlflow_run(direct)
        assert run.info.artifact_uri.startswith(str(direct_artifacts)), run.info.artifact_uri
        written = sorted(p.name for p in direct_artifacts.rglob("step_*.json"))
        # The sample tables and each evaluation's file, written to the folder store itself.
        assert written == [
            "step_000000010.json",
            "step_000000010_job_1.json",
            "step_000000020.json",
            "step_000000020_job_2.json",
        ], written


def test_an_unset_token_pauses_the_sink_with_its_name_and_results_wait(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    # The fast half of the wrong-credentials case (the basic-auth server's is marked long): refused, not
    # down: one tracker.paused line naming the variable, results stored and waiting, none dropped.
    setup = _setup(
        tmp_path, mlflow_server.uri, extra='attach = "own"\ntoken_env = "EVALD_T_TOKEN"\npause_secs = 0.3'
    )
    with structlog.testing.capture_logs() as logs:
        relay = relay_for(setup, {})
        for step in (10, 20):
            store_result(setup, step, metrics_at(step))
        wait_for(lambda: failed_attempts(setup.database) >= 4 or None, 30, "refused attempts after pauses")
        relay.stop()
    paused = [e for e in logs if e["event"] == "tracker.paused"]
    assert len(paused) == 1, paused
    assert "EVALD_T_TOKEN is not set or empty" in paused[0]["error"]
    assert outbox(setup.database) == {"pending": 2}


def test_a_backlog_goes_in_batches_once_each(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    gate = Gate(mlflow_server.port)
    setup = _setup(tmp_path, gate.uri, extra='attach = "own"\nbatch = 200')
    try:
        relay = relay_for(setup)
        store_result(setup, 1, metrics_at(1))
        wait_for(lambda: delivered(setup.database, 1), 60, "the first message delivered")
        # The backlog is stored with no relay running (a daemon down while the server was away), so the
        # first attempt claims all of it: a relay taking part of it while the rest was still being stored
        # would retry the parts at different times.
        relay.stop()
        gate.close()
        steps = range(2, 122)
        for step in steps:
            store_result(setup, step, metrics_at(step))
        relay_for(setup)
        wait_for(lambda: failed_attempts(setup.database) or None, 30, "a failed attempt recorded")
        with structlog.testing.capture_logs() as logs:
            gate.open()
            wait_for(lambda: delivered(setup.database, 121), 60, "the backlog delivered")
            # Said once the delivery is recorded: the line may come just after.
            said = "tracker.delivered"
            wait_for(lambda: any(e["event"] == said for e in logs) or None, 30, "the line said")
        # 120 claimed in one transaction, in one log_batch call (240 values and evald's 3 tags), marked
        # delivered in one: a line for the lot.
        sent = [e for e in logs if e["event"] == "tracker.delivered"]
        assert [e["messages"] for e in sent] == [120], sent
        assert assert_equal_to_results(setup) == 121 * 2
    finally:
        gate.close()


def test_values_taken_without_their_tags_and_files_are_not_logged_twice(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    # MLflow's SQL store commits a batch's metrics and its tags in two transactions, and the files go
    # after: a server that died between them kept the values only. Sent again, the values carry the
    # evaluation's own timestamp, so the store keeps each once; tags and files are written again.
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"')
    relay = relay_for(setup)
    for step in (10, 20, 30):
        store_result(setup, step, metrics_at(step))
    wait_for(lambda: delivered(setup.database, 3), 60, "3 delivered")
    relay.stop()
    client, run = mlflow_run(setup)
    client.delete_tag(run.info.run_id, "evald.last_step")
    redeliver(setup.database)
    relay_for(setup)
    wait_for(lambda: delivered(setup.database, 3), 60, "3 delivered again")
    assert assert_equal_to_results(setup) == 6
    assert len(evaluation_files(setup)) == 3


def test_a_message_mlflow_rejects_is_given_up_and_the_rest_of_its_batch_delivered(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    from daemon.delivery.messages import MetricValue, ResultMessage

    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"')
    # Queued with no relay running, so the four go in one claim and one log_batch.
    store_result(setup, 10, metrics_at(10))
    bad = ResultMessage(
        RUN, "/r", 999, "no!good", "full", 15, "step_15", "/r/step_15", (MetricValue("a", 1.0, None, 1),)
    )
    with setup.database.session() as s:
        assert enqueue_raw(s, setup, bad)
    for step in (20, 30):
        store_result(setup, step, metrics_at(step))
    with structlog.testing.capture_logs() as logs:
        relay_for(setup)
        wait_for(lambda: outbox(setup.database) == {"delivered": 3, "failed": 1} or None, 60, "3 in, 1 out")
        # Said once the failure is recorded: the line may come just after.
        wait_for(lambda: any(e["event"] == "tracker.rejected" for e in logs) or None, 30, "the line said")
    rejected = [e for e in logs if e["event"] == "tracker.rejected"]
    assert len(rejected) == 1 and "INVALID_PARAMETER_VALUE" in rejected[0]["error"], rejected
    assert assert_equal_to_results(setup) == 6


def enqueue_raw(session: Any, setup: Setup, message: Any) -> bool:
    """A message put in the outbox as is, not built from a stored result."""
    return enqueue_message(
        session,
        run_id=setup.run_id,
        endpoint=setup.config.trackers[0].endpoint,
        event_id=f"trk_test_{uuid.uuid4().hex[:12]}",
        body=message.to_json(),
    )


ALERT_ON_ACCURACY = "[alerts.thresholds.accuracy]\nmin = 0.05\n"


def firing_tag(setup: Setup) -> dict[str, Any]:
    _, run = mlflow_run(setup)
    value: dict[str, Any] = json.loads(run.data.tags["evald.alerts.firing"])
    return value


def test_alerts_go_to_mlflow_as_files_and_the_firing_tag(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"', after=ALERT_ON_ACCURACY)
    relay_for(setup)
    # Accuracy 0.01 at step 10: the threshold fires; 0.1 at step 100: it resolves.
    store_result(setup, 10, metrics_at(10))
    wait_for(lambda: outbox(setup.database).get("pending", 0) == 0 or None, 60, "sent")
    with setup.database.session() as s:
        (alert,) = [a for a in alerting.alert_rows(s, run=RUN) if a.rule == "threshold"]
    fired = alert_files(setup)[alert.id]
    assert (fired["state"], fired["rule"], fired["metric"], fired["step"], fired["severity"]) == (
        "firing",
        "threshold",
        "accuracy",
        10,
        "critical",
    )
    firing = firing_tag(setup)
    assert (
        firing["count"] == 1 and "threshold on arith/accuracy at step 10" in firing["alerts"][str(alert.id)]
    )
    store_result(setup, 100, metrics_at(100))
    wait_for(lambda: outbox(setup.database).get("pending", 0) == 0 or None, 60, "sent")
    with setup.database.session() as s:
        rows = alerting.alert_rows(s, run=RUN)
    assert rows
    files = alert_files(setup)
    for row in rows:
        # Every alert evald stored, in MLflow with the state evald says.
        assert files[row.id]["state"] == row.state, row
    assert (files[alert.id]["state"], files[alert.id]["step"]) == ("resolved", 100)
    assert firing_tag(setup) == {"count": 0, "alerts": {}}
    assert assert_equal_to_results(setup) == 4


#: Accuracy 0.01 at step 10 fires the accuracy threshold, 0.1 at step 100 resolves it; response length
#: 110 at step 100 fires its own, which stays firing.
TWO_ALERTS = ALERT_ON_ACCURACY + "[alerts.thresholds.response_length]\nmax = 50\n"


def alert_tags(setup: Setup) -> dict[int, dict[str, Any]]:
    """Each alert's latest event in MLflow (its file), by alert id; the firing tag agrees with them."""
    found = alert_files(setup)
    firing = firing_tag(setup)
    assert {int(k) for k in firing["alerts"]} == {i for i, f in found.items() if f["state"] == "firing"}
    assert firing["count"] == len(firing["alerts"])
    return found


def test_backfill_sends_each_stored_alert_in_its_state_once(
    tmp_path: Path, mlflow_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"', after=TWO_ALERTS)
    # Alerts stored before any tracker was configured.
    setup.alerter = Alerter(setup.config.model_copy(update={"trackers": ()}))
    for step in (10, 100):
        store_result(setup, step, metrics_at(step))
    assert outbox(setup.database) == {}
    assert main(["--config", str(setup.config_path), "export", "mlflow", "--run", RUN]) == 0
    first = capsys.readouterr().out
    assert "2 evaluation(s) and 2 alert(s)" in first and "4 sent" in first, first
    with setup.database.session() as s:
        stored = {a.id: a for a in alerting.alert_rows(s, run=RUN)}
    tags = alert_tags(setup)
    assert {i: t["state"] for i, t in tags.items()} == {i: a.state for i, a in stored.items()}
    assert sorted(a.state for a in stored.values()) == ["firing", "resolved"]
    for alert_id, tag in tags.items():
        alert = stored[alert_id]
        assert (tag["rule"], tag["metric"]) == (alert.rule, alert.metric)
        # A resolved alert says when its episode started and ended; a firing one has no end.
        assert tag["starts_at"] and (tag["ends_at"] is None) == (alert.state == "firing"), tag
        assert tag["step"] == (alert.resolved_step if alert.state == "resolved" else alert.first_step)
    assert main(["--config", str(setup.config_path), "export", "mlflow", "--run", RUN]) == 0
    second = capsys.readouterr().out
    assert "0 queued" in second and "0 sent" in second and "4 already there" in second, second
    assert alert_tags(setup) == tags
    assert assert_equal_to_results(setup) == 4


def test_a_backfill_after_live_delivery_queues_no_alert_again(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"', after=TWO_ALERTS)
    relay = relay_for(setup)
    for step in (10, 100):
        store_result(setup, step, metrics_at(step))
    # Live: two evaluations; the accuracy alert fired then resolved, the length alert fired.
    wait_for(lambda: delivered(setup.database, 5), 60, "5 delivered live")
    relay.stop()
    live = alert_tags(setup)
    assert main(["--config", str(setup.config_path), "export", "mlflow", "--run", RUN]) == 0
    said = capsys.readouterr().out
    # Each alert's latest event went live under the id the backfill gives it: nothing queued again.
    assert "0 queued" in said and "0 sent" in said and "4 already there" in said, said
    assert outbox(setup.database) == {"delivered": 5}
    assert alert_tags(setup) == live
    assert assert_equal_to_results(setup) == 4


def stored_points(server: MlflowServer, run_id: str) -> dict[tuple[str, int], list[float]]:
    """Every metric row of ``run_id`` in the server's own store (its SQLite file), by key and step: one
    query, where reading 1,200 keys' histories through the client takes a minute."""
    with contextlib.closing(sqlite3.connect(f"file:{server.folder / 'mlflow.db'}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT key, step, value FROM metrics WHERE run_uuid = ?", (run_id,)).fetchall()
    points: dict[tuple[str, int], list[float]] = {}
    for key, step, value in rows:
        points.setdefault((key, int(step)), []).append(float(value))
    return points


@pytest.mark.long
def test_an_evaluation_of_more_values_than_one_log_batch_takes_is_delivered_whole_once(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    # A 1,000-value batch takes the server seconds on two busy cores: a timeout that lets it answer.
    setup = _setup(tmp_path, mlflow_server.uri, extra='attach = "own"', timeout_secs=60)
    # 1,200 metrics: past MLflow's 1,000 a call.
    wide = [queries.MetricRow(f"m{i:04d}", i / 1200, 10, 0.01) for i in range(1200)]
    store_result(setup, 10, metrics_at(10))
    store_result(setup, 20, wide)
    store_result(setup, 30, metrics_at(30))
    relay = relay_for(setup)
    wait_for(lambda: delivered(setup.database, 3), 60, "3 delivered")
    relay.stop()
    # Sent again by a new relay (a crash before the outbox's mark): nothing doubled.
    redeliver(setup.database)
    relay_for(setup)
    wait_for(lambda: delivered(setup.database, 3), 60, "3 delivered again")
    _, run = mlflow_run(setup)
    with setup.database.session() as s:
        rows = queries.result_rows(s, run=RUN)
    expected: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        assert row.step is not None and row.stderr is not None and row.n is not None
        key = f"eval/{row.task}/{row.metric}"
        expected[(key, row.step)] = [row.value]
    assert len(expected) == 1204
    assert stored_points(mlflow_server, run.info.run_id) == expected
    (wide_file,) = [f for f in evaluation_files(setup) if f["step"] == 20]
    assert wide_file["metrics"]["m1199"] == {
        "key": "eval/arith/m1199",
        "value": 1199 / 1200,
        "stderr": 0.01,
        "n": 10,
    }
