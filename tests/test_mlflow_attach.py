"""Attaching to the trainer's MLflow run, found where trainers leave it, each written by the real writer.

HF Trainer's own ``MLflowCallback`` logging to the real ``mlflow server`` (found by the server's search:
its ``output_dir`` parameter, or the run name and tags it was given), MLflow's client writing a local
``mlflow.db`` under the run root, and a trainer's ``mlflow_run_id`` file; a file that holds no run id is a
log line naming it, next to the good ones. Read back through MLflow's client, equal to ``evald results``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from daemon.delivery.sinks.mlflow_attach import on_disk, run_id_from_file, search_filter
from tests.harness import wait_for
from tests.mlflowserver import MlflowServer, mlflow_server_fixture, require_mlflow
from tests.test_trackers_mlflow import (
    Setup,
    _setup,
    assert_equal_to_results,
    delivered,
    metrics_at,
    relay_for,
    store_result,
)

mlflow_server = mlflow_server_fixture()
__all__ = ["relay_for"]

RUN_ID = "0123456789abcdef0123456789abcdef"


def attached(logs: list[Any]) -> list[tuple[str, str]]:
    return [(e["trainer_run"], e["found_in"]) for e in logs if e["event"] == "tracker.attached"]


def deliver_one(setup: Setup, relay_for: Any) -> list[Any]:
    with structlog.testing.capture_logs() as logs:
        relay_for(setup)
        store_result(setup, 10, metrics_at(10))
        wait_for(lambda: delivered(setup.database, 1), 120, "delivered")
    return logs


@pytest.fixture
def hf_trainer_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Start a run the way HF Trainer does (its ``MLflowCallback.setup``, with its environment variables),
    end it, and give its id."""
    require_mlflow()
    import mlflow
    from transformers import TrainerState, TrainingArguments
    from transformers.integrations.integration_utils import MLflowCallback

    def start(uri: str, experiment: str, output_dir: Path, **args: Any) -> str:
        tags = args.pop("tags", {})
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment)
        monkeypatch.setenv("MLFLOW_TAGS", json.dumps(tags))
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
        callback = MLflowCallback()  # type: ignore[no-untyped-call]
        callback.setup(  # type: ignore[no-untyped-call]
            TrainingArguments(output_dir=str(output_dir), report_to="none", **args), TrainerState(), None
        )
        run_id = str(mlflow.active_run().info.run_id)  # type: ignore[union-attr]
        mlflow.end_run()
        return run_id

    yield start
    if mlflow.active_run() is not None:
        mlflow.end_run()


def test_hf_trainers_run_is_found_on_the_server_by_its_output_dir_or_name_and_tags(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any, hf_trainer_run: Any
) -> None:
    experiment = f"hf-{uuid.uuid4().hex[:8]}"
    # Found with nothing configured: HF logs the training arguments, output_dir (the run root) among them.
    by_dir = tmp_path / "by-dir"
    by_dir.mkdir()
    # Another run of the same experiment, newer, whose output_dir is elsewhere: not taken.
    first = hf_trainer_run(mlflow_server.uri, experiment, by_dir / "run", run_name="grpo-a")
    hf_trainer_run(mlflow_server.uri, experiment, tmp_path / "elsewhere", run_name="grpo-other")
    setup = _setup(by_dir, mlflow_server.uri, experiment=experiment)
    assert str(setup.config.runs[0].root) == str(by_dir / "run")
    logs = deliver_one(setup, relay_for)
    assert attached(logs) == [
        (first, f"search in experiment {experiment!r}: param output_dir = {by_dir / 'run'}")
    ], logs

    # Found by the run name ({run}: the evald run's) and the MLFLOW_TAGS the trainer was given.
    by_name = tmp_path / "by-name"
    by_name.mkdir()
    experiment = f"hf-{uuid.uuid4().hex[:8]}"
    hf_trainer_run(
        mlflow_server.uri, experiment, tmp_path / "x", run_name="grpo-toy", tags={"team": "rl", "try": "1"}
    )
    second = hf_trainer_run(
        mlflow_server.uri, experiment, tmp_path / "y", run_name="grpo-toy", tags={"team": "rl", "try": "2"}
    )
    setup = _setup(
        by_name,
        mlflow_server.uri,
        experiment=experiment,
        extra='trainer_run_name = "grpo-{run}"\ntrainer_tags = { team = "rl", try = "2" }',
    )
    logs = deliver_one(setup, relay_for)
    (found,) = attached(logs)
    assert found[0] == second and "attributes.run_name = 'grpo-toy'" in found[1], found
    # Into the trainer's run (the experiment holds the two HF runs and no own run of evald's).
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    assert [m.step for m in client.get_metric_history(second, "eval/arith/accuracy")] == [10]
    assert client.get_run(second).data.params["output_dir"] == str(tmp_path / "y")
    found_experiment = client.get_experiment_by_name(experiment)
    assert found_experiment is not None
    assert not client.search_runs([found_experiment.experiment_id], "tags.`evald.run` = 'toy'")


def test_a_trainers_local_mlflow_db_under_the_run_root_is_attached(
    tmp_path: Path, relay_for: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_mlflow()
    from mlflow.tracking import MlflowClient

    root = tmp_path / "run"
    root.mkdir()
    store = f"sqlite:///{root / 'mlflow.db'}"
    # The trainer: MLflow 3's default local store, mlflow.db in its working folder (the run root).
    monkeypatch.chdir(tmp_path)
    trainer = MlflowClient(store)
    experiment = f"local-{uuid.uuid4().hex[:8]}"
    experiment_id = trainer.create_experiment(experiment)
    old = trainer.create_run(experiment_id, run_name="old")
    time.sleep(0.01)  # started later: the newest
    run = trainer.create_run(experiment_id, run_name="grpo")
    trainer.set_terminated(old.info.run_id)
    setup = _setup(tmp_path, store, experiment=experiment)
    logs = deliver_one(setup, relay_for)
    assert attached(logs) == [(run.info.run_id, str(root / "mlflow.db"))], logs
    # The newest run: the experiment's other run got nothing.
    assert trainer.get_run(old.info.run_id).data.metrics == {}
    assert set(trainer.get_run(run.info.run_id).data.metrics) >= {"eval/arith/accuracy"}
    trainer.delete_run(old.info.run_id)
    assert assert_equal_to_results(setup) == 2


def test_a_run_id_file_is_attached_and_a_bad_one_is_named_beside_good_results(
    tmp_path: Path, mlflow_server: MlflowServer, relay_for: Any
) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    experiment = f"file-{uuid.uuid4().hex[:8]}"
    trainer = client.create_run(client.create_experiment(experiment), run_name="grpo")
    good = tmp_path / "good"
    good.mkdir()
    setup = _setup(good, mlflow_server.uri, experiment=experiment)
    # What a trainer script writes after mlflow.start_run(): the variable's line, as in a .env file.
    (setup.config.runs[0].root / "mlflow_run_id").write_text(f"# grpo\nMLFLOW_RUN_ID={trainer.info.run_id}\n")
    logs = deliver_one(setup, relay_for)
    assert attached(logs) == [(trainer.info.run_id, str(setup.config.runs[0].root / "mlflow_run_id"))]
    assert assert_equal_to_results(setup) == 2

    bad = tmp_path / "bad"
    bad.mkdir()
    setup = _setup(bad, mlflow_server.uri, extra='attach = "trainer"')
    (setup.config.runs[0].root / "mlflow_run_id").write_text("run 42\n")
    logs = deliver_one(setup, relay_for)
    (said,) = [e for e in logs if e["event"] == "tracker.trainer_run_unreadable"]
    assert str(setup.config.runs[0].root / "mlflow_run_id") in said["error"]
    assert "MLFLOW_RUN_ID=<id>" in said["error"], said
    # Delivered anyway, to an own run.
    assert [e["event"] for e in logs if e["event"] == "tracker.own_run"] == ["tracker.own_run"]
    assert assert_equal_to_results(setup) == 2


def test_run_id_files_and_local_stores_read_each_format_and_name_each_bad_one(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    assert on_disk(root) == ([], [])
    (root / "mlflow_run_id").write_text(f"{RUN_ID.upper()}\n")
    assert run_id_from_file(root) == RUN_ID
    (root / "mlflow_run_id").write_text(f"export MLFLOW_RUN_ID='{RUN_ID}'\nOTHER=1\n")
    assert run_id_from_file(root) == RUN_ID
    meta = root / "mlruns" / "1" / "abc" / "meta.yaml"
    meta.parent.mkdir(parents=True)
    meta.write_text("run_id: abc\nstatus: 1\n")
    assert on_disk(root) == ([(str(root / "mlflow_run_id"), RUN_ID), (str(root / "mlruns"), "abc")], [])
    # Bad ones are named (file and fix), and do not hide the good one beside them.
    (root / "mlflow_run_id").write_text("MLFLOW_RUN_ID=\n")
    (root / "mlflow.db").write_text("not a database")
    found, problems = on_disk(root)
    assert found == [(str(root / "mlruns"), "abc")]
    assert problems[0].startswith(f"{root / 'mlflow_run_id'}: no MLflow run id"), problems
    assert problems[1].startswith(f"{root / 'mlflow.db'}: not a readable MLflow store"), problems


def test_the_search_quotes_what_it_is_given() -> None:
    assert search_filter(run="toy", root="/r/it's", run_name=None, tags={}) == (
        "params.`output_dir` = '/r/it\\'s'",
        "param output_dir = /r/it's",
    )
    query, _ = search_filter(run="toy", root="/r", run_name="{run}-grpo", tags={"a.b": "x"})
    assert query == "attributes.run_name = 'toy-grpo' and tags.`a.b` = 'x'"
