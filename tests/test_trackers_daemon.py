"""The daemon with an MLflow tracker, end to end: the toy trainer's checkpoints evaluated by ``evald run``
(real worker processes, the session's toy model), each evaluation sent by the daemon's tracker relay to a
real ``mlflow server`` (tests/mlflowserver.py, shared with the other tracker tests), and read back through
MLflow's client: every value ``evald results --format json`` prints, at its step, once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from daemon.cli import main
from storage.database import Database
from tests.conftest import ToyRun
from tests.deadlines import patient
from tests.harness import all_jobs_done, running_daemon, upgraded, wait_for, write_config, write_dataset
from tests.mlflowserver import MlflowServer, mlflow_server_fixture
from tests.test_trackers_mlflow import outbox

mlflow_server = mlflow_server_fixture()

pytestmark = pytest.mark.slow


def evald_results(config: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["--config", str(config), "results", "--run", "toy", "--format", "json"]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return rows


def all_sent(database: Database, evaluations: int) -> bool | None:
    """Nothing left pending, and at least the evaluations delivered (an alert the detectors fire on the
    toy's curve goes to MLflow too)."""
    counts = outbox(database)
    return (counts.get("pending", 0) == 0 and counts.get("delivered", 0) >= evaluations) or None


def assert_run_equals_results(client: Any, run: Any, rows: list[dict[str, Any]]) -> None:
    """MLflow's run holds every value ``evald results --format json`` printed, at its step, once each,
    and nothing else under ``eval/``; its stderr and n in the evaluation's file."""
    expected: dict[str, list[tuple[int, float]]] = {}
    spread: dict[tuple[str, int], tuple[float | None, int | None]] = {}
    for row in rows:
        if row["n"] == 0:
            # A mean over no samples has no value to plot: not sent (daemon/delivery/messages.py).
            continue
        base = f"eval/{row['task']}" if row["stage"] == "full" else f"eval/{row['task']}/{row['stage']}"
        key = f"{base}/{row['metric']}"
        expected.setdefault(key, []).append((row["step"], row["value"]))
        spread[(key, row["step"])] = (row["stderr"], row["n"])
    assert set(run.data.metrics) == set(expected)
    with tempfile.TemporaryDirectory() as folder:
        got = Path(client.download_artifacts(run.info.run_id, "evald/evaluations", folder))
        files = [json.loads(p.read_text()) for p in got.rglob("*.json")]
    in_files = {(m["key"], f["step"]): (m["stderr"], m["n"]) for f in files for m in f["metrics"].values()}
    assert {k: v for k, v in in_files.items() if k[0] in expected} == spread
    for key, points in expected.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        # Once each: the same steps (no step twice), each value as evald printed it.
        assert [step for step, _ in history] == sorted(step for step, _ in points), key
        assert [v for _, v in history] == pytest.approx([v for _, v in sorted(points)], rel=1e-9), key


@pytest.mark.long
def test_the_daemon_sends_the_toy_runs_results_to_mlflow_once_each(
    tmp_path: Path, toy_run: ToyRun, mlflow_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    url = f"sqlite:///{tmp_path / 'evald.db'}"
    database: Database = upgraded(url)
    dataset = write_dataset(tmp_path / "arith.jsonl", 8)
    config = write_config(tmp_path, url, dataset=dataset)
    experiment = f"daemon-{uuid.uuid4().hex[:8]}"
    with config.open("a") as out:
        out.write(
            f'\n[[trackers]]\nkind = "mlflow"\ntracking_uri = "{mlflow_server.uri}"\n'
            f'experiment = "{experiment}"\nattach = "own"\nsamples = 4\n'
        )
    saved = sorted(p for p in toy_run.path.iterdir() if p.is_dir() and p.name.startswith("step_"))
    assert len(saved) >= 2, saved
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        for checkpoint in saved:
            shutil.copytree(checkpoint, tmp_path / "run" / checkpoint.name)
        wait_for(
            lambda: all_jobs_done(database, len(saved)), 240, "every checkpoint evaluated", daemon.process
        )
        wait_for(lambda: all_sent(database, len(saved)), 60, "every evaluation in MLflow", daemon.process)
        assert daemon.stop() == 0
    rows = evald_results(config, capsys)
    assert {r["step"] for r in rows} == {int(p.name.split("_")[1]) for p in saved}
    client = MlflowClient(mlflow_server.uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    (run,) = client.search_runs([found.experiment_id])
    assert_run_equals_results(client, run, rows)
    # The sample tables: one JSON artifact per evaluation, at its step.
    artifacts = client.list_artifacts(run.info.run_id, "evald/samples/arith")
    assert sorted(Path(a.path).name for a in artifacts) == [
        f"step_{s:09d}.json" for s in sorted({r["step"] for r in rows})
    ]
    # The daemon's own log says where results went.
    log = (tmp_path / "daemon.log").read_text()
    assert '"tracker.delivered"' in log
    database.dispose()


@pytest.mark.long
def test_the_demo_sends_its_results_to_mlflow_and_says_where(
    tmp_path: Path, mlflow_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """``evald demo`` with ``trackers.toml`` in its workspace: the README's first command, its results in
    MLflow equal to ``evald results`` at every step, once each, and a line saying where they went."""
    from mlflow.tracking import MlflowClient

    workdir = tmp_path / "demo"
    workdir.mkdir()
    experiment = f"demo-{uuid.uuid4().hex[:8]}"
    (workdir / "trackers.toml").write_text(
        f'[[trackers]]\nkind = "mlflow"\ntracking_uri = "{mlflow_server.uri}"\n'
        f'experiment = "{experiment}"\nattach = "own"\n',
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "demo", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=patient(600),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("results also went to")]
    rows = evald_results(workdir / "evald.toml", capsys)
    evaluations = len({(r["step"], r["task"], r["stage"]) for r in rows})
    assert evaluations == 8, rows
    assert f"experiment '{experiment}'" in line and f"{evaluations} of {evaluations} evaluation(s)" in line
    # The collapse's alert went to MLflow too, and all of them were delivered before the demo ended.
    assert "alert event(s) delivered" in line and "the rest" not in line, line
    client = MlflowClient(mlflow_server.uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    (run,) = client.search_runs([found.experiment_id])
    assert_run_equals_results(client, run, rows)
    assert client.list_artifacts(run.info.run_id, "evald/alerts"), "the alert's file"
    assert {k for k in run.data.tags if k.startswith("evald.")} == {
        "evald.run",
        "evald.root",
        "evald.last_step",
        "evald.alerts.firing",
        "evald.results",
    }
