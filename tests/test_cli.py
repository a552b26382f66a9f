"""The CLI contract: one clear line and a non-zero exit for bad input, and the documented outputs."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.cli.datasets import dataset_problems
from daemon.cli.devices import device_problem
from daemon.config import load_config
from inference.errors import DatasetInvalid
from storage import migrations, queries, schema
from storage.database import Database
from storage.models import CheckpointState
from tests.conftest import ToyRun
from tests.harness import evald, running_daemon, upgraded, write_config, write_dataset


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write_dataset(tmp_path / "arith.jsonl", 5)


def _errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_bad_config_is_one_line_per_problem_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "evald.toml"
    path.write_text('[[runs]]\nname = "r"\nroot = "."\n\n[[tasks]]\nname = "t"\ndataset = "nope.jsonl"\n')
    assert main(["config", "check", str(path)]) == 2
    assert _errors(capsys) == [f"evald: {path}: tasks[0].dataset: file not found: {tmp_path / 'nope.jsonl'}"]
    assert main(["--config", str(tmp_path / "missing.toml"), "status"]) == 2
    assert _errors(capsys) == [
        f"evald: {tmp_path / 'missing.toml'}: file not found (pass --config or set EVALD_CONFIG)"
    ]


def test_config_check_ok(tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=dataset)
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok (1 runs, 1 tasks")


def test_config_check_takes_the_global_config_option(
    tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``evald --config X config check`` failed with "required: file"."""
    path = write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=dataset)
    assert main(["--config", str(path), "config", "check"]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok (1 runs, 1 tasks")
    monkeypatch.setenv("EVALD_CONFIG", str(path))
    assert main(["config", "check"]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok")


def test_a_cuda_device_on_a_host_without_cuda_is_refused_up_front(
    tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It passed ``config check``, then failed in the worker with torch's traceback on one line."""
    import torch

    assert not torch.cuda.is_available()  # this machine: no GPU, a CPU build of torch
    path = write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=dataset)
    path.write_text(path.read_text().replace("[inference]\n", '[inference]\ndevice = "cuda"\n', 1))
    assert main(["config", "check", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"evald: {path}: inference.device: 'cuda', but this torch"), line
    assert 'set device = "cpu"' in line and "GPU node" in line
    # Under Slurm or Ray the workers run elsewhere: this host does not speak for them.
    config = load_config(path)
    slurm = config.model_copy(update={"executor": config.executor.model_copy(update={"kind": "slurm"})})
    assert device_problem(slurm) is None


def test_unreachable_database_is_one_line_and_exit_1(tmp_path: Path, dataset: Path) -> None:
    path = write_config(tmp_path, "postgresql://evald@127.0.0.1:1/evald", dataset=dataset)
    # `run` would keep trying for a minute first (test_outages checks that wait); one try is enough here.
    path.write_text(path.read_text().replace("[database]\n", "[database]\nstart_timeout_secs = 0\n", 1))
    for command in (["status"], ["run"], ["db", "upgrade"], ["results"]):
        done = evald("--config", str(path), *command)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, (command, done.stderr)
        assert len(lines) == 1 and lines[0].startswith("evald: error: cannot reach database"), (
            command,
            lines,
        )
        assert "127.0.0.1:1" in lines[0]


def test_run_refuses_an_old_schema(tmp_path: Path, dataset: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    path = write_config(tmp_path, url, dataset=dataset)
    old = Database(url)
    migrations.upgrade(old, "0001")
    old.dispose()
    done = evald("--config", str(path), "run")
    assert done.returncode == 1
    assert done.stderr.strip().endswith("run `evald db upgrade`")
    upgrade = evald("--config", str(path), "db", "upgrade")
    assert upgrade.returncode == 0 and "upgraded from 0001 to revision" in upgrade.stdout
    assert "already at revision" in evald("--config", str(path), "db", "upgrade").stdout


def test_run_creates_a_new_sqlite_database_itself(tmp_path: Path, dataset: Path) -> None:
    """The embedded default needed `evald db upgrade` before the first `evald run`."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    path = write_config(tmp_path, url, dataset=dataset)
    log = tmp_path / "daemon.log"
    with running_daemon(path, log) as daemon:
        assert daemon.stop() == 0
    created = [json.loads(line) for line in log.read_text().splitlines() if '"db.created"' in line]
    assert [e["revision"] for e in created] == [schema.HEAD_REVISION]
    database = Database(url)
    assert schema.current_revision(database) == schema.HEAD_REVISION
    database.dispose()
    # A file holding another program's tables is never migrated into.
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    path = write_config(tmp_path, f"sqlite:///{other}", dataset=dataset)
    done = evald("--config", str(path), "run")
    assert done.returncode == 1 and "has no evald schema" in done.stderr


def _stored(url: str) -> Database:
    database = upgraded(url)
    with database.session() as s:
        run_id = queries.ensure_run(s, "toy", "/r")
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/r/step_5",
            name="step_5",
            step=5,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=5, tasks=["arith"])
        job = queries.claim_next_job(s, "h:1")
        assert job is not None
        queries.complete_job(
            s,
            job_id=job.id,
            owner="h:1",
            duration_s=1.0,
            load_s=0.1,
            metrics=[
                queries.MetricRow("accuracy", 0.25, 4, 0.2165),
                queries.MetricRow("wall_s", 1.0, None, None),
            ],
            samples=[],
        )
    return database


def test_results_in_every_format(
    database_url: str, tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _stored(database_url).dispose()
    path = str(write_config(tmp_path, database_url, dataset=dataset))
    assert main(["--config", path, "results", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [set(r) for r in rows] == [
        {
            "run",
            "checkpoint",
            "step",
            "epoch",
            "task",
            "stage",
            "metric",
            "value",
            "n",
            "stderr",
            "evaluated_at",
            "no_samples",
        }
    ] * 2
    assert (rows[0]["metric"], rows[0]["value"], rows[0]["n"], rows[0]["step"]) == ("accuracy", 0.25, 4, 5)
    assert main(["--config", path, "results", "--metric", "wall_s", "--format", "csv"]) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["metric"], r["value"], r["n"]) for r in parsed] == [("wall_s", "1.0", "")]
    # A run that does not exist is an error naming the runs (it printed an empty table, exit 0, before).
    assert main(["--config", path, "results", "--run", "other"]) == 1
    assert _errors(capsys) == ["evald: error: no run 'other' (runs: toy)"]
    # Filters that exist but match nothing: an empty table.
    assert main(["--config", path, "results", "--run", "toy", "--steps", "100:"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2  # header and rule only
    assert main(["--config", path, "status", "--format", "json"]) == 0
    status = json.loads(capsys.readouterr().out)
    toy = status["runs"]["toy"]
    assert toy["jobs"] == {"succeeded": 1} and toy["last_evaluated_step"] == 5
    assert status["resources"] is None


def test_history_lists_every_worker_run_of_a_job(
    sqlite_url: str, tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = _stored(sqlite_url)
    with database.session() as s:
        (job,) = queries.job_rows(s)
        started = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
        for outcome, kind, batch in (("out_of_memory", "out_of_memory", 8), ("succeeded", None, 4)):
            queries.record_attempt(
                s,
                queries.AttemptRow(
                    job_id=job.id,
                    attempt=1,
                    engine="deepspeed",
                    tp=2,
                    dp=1,
                    batch_size=batch,
                    outcome=outcome,
                    error_kind=kind,
                    error="rank 1: out of memory at batch size 8:\n  CUDA" if kind else None,
                    started_at=started,
                    finished_at=started + timedelta(seconds=3),
                    duration_s=3.0,
                ),
            )
    database.dispose()
    path = str(write_config(tmp_path, sqlite_url, dataset=dataset))

    assert main(["--config", path, "history", str(job.id), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["outcome"], r["batch_size"], r["tp"], r["error_kind"]) for r in rows] == [
        ("out_of_memory", 8, 2, "out_of_memory"),
        ("succeeded", 4, 2, None),
    ]
    assert main(["--config", path, "history", str(job.id)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["attempt", "outcome", "engine"]
    assert "rank 1: out of memory at batch size 8: CUDA" in table[2]  # one line per attempt
    assert main(["--config", path, "history", "999"]) == 1
    assert _errors(capsys) == ["evald: error: no job 999 (see `evald status` for job ids)"]


def test_eval_command_and_a_bad_dataset_line(
    toy_run: ToyRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = str(toy_run.last_checkpoint)
    data = write_dataset(tmp_path / "good.jsonl", 4)
    path = str(write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=data))
    assert main(["--config", path, "eval", checkpoint, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"][0]["task"] == "arith" and out["tasks"][0]["n"]["accuracy"] == 4
    lines = data.read_text().splitlines()
    data.write_text("\n".join([lines[0], '{"problem": "1+1"}', *lines[1:]]) + "\n")
    # One bad row costs only itself: the rest are evaluated and the row is reported.
    assert main(["--config", path, "eval", checkpoint]) == 0
    out = capsys.readouterr().out
    assert f"arith: left out: {data}:2: missing field 'answer'" in out.splitlines()
    data.write_text('{"problem": "1+1"}\n')
    assert main(["--config", path, "eval", checkpoint]) == 1
    [error] = _errors(capsys)
    assert error.startswith("evald: error: ") and f"{data}: no usable rows" in error and "answer" in error


@pytest.mark.long
def test_eval_tries_a_layout_of_ranks_given_on_the_command_line(
    toy_run: ToyRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = str(toy_run.last_checkpoint)
    data = write_dataset(tmp_path / "good.jsonl", 6)
    path = str(write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=data))
    metrics = []
    for layout in ([], ["--engine", "deepspeed", "--tp", "2", "--dp", "1"], ["--engine", "hf", "--dp", "2"]):
        assert main(["--config", path, "eval", checkpoint, "--format", "json", *layout]) == 0
        task = json.loads(capsys.readouterr().out)["tasks"][0]
        metrics.append(
            (task["metrics"]["accuracy"], task["metrics"]["response_length"], task["n"]["accuracy"])
        )
    assert metrics[0] == metrics[1] == metrics[2] and metrics[0][2] == 6

    assert main(["--config", path, "eval", checkpoint, "--engine", "hf", "--tp", "2"]) == 2
    [error] = _errors(capsys)
    assert error.startswith(
        "evald: command line: --engine/--tp/--dp: engine 'hf' cannot shard a model (tp = 2)"
    )


def test_a_bad_dataset_line_fails_the_check_and_an_unusable_dataset_the_start(
    tmp_path: Path, dataset: Path
) -> None:
    lines = dataset.read_text().splitlines()
    dataset.write_text("\n".join([*lines[:2], "{not json", *lines[2:], "[]"]) + "\n")
    path = write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=dataset)
    done = evald("--config", str(path), "config", "check", str(path))
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"evald: error: {dataset}:3: invalid JSON: Expecting property name enclosed in double quotes "
        "(column 2) (and 1 more bad rows)"
    ]

    dataset.write_text("{not json\n[]\n")
    done = evald("--config", str(path), "run")
    lines_out = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines_out) == 1 and lines_out[0].startswith(
        f"evald: error: {dataset}: no usable rows, all 2 are bad"
    )


def test_the_start_check_reads_the_fields_subsets_stratify_by(tmp_path: Path) -> None:
    data = tmp_path / "levelled.jsonl"
    rows = ({"id": str(i), "problem": f"{i}+1", "answer": i + 1, "level": i % 3} for i in range(6))
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    path = write_config(tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=data)
    text = path.read_text()
    good = text + '\n[scheduling.two_stage.arith]\nquick_size = 3\nstratify_field = "level"\n'
    path.write_text(good)
    assert dataset_problems(load_config(path)) == []

    # A typo in the stratify field would leave every job without a usable row: the start stops on it.
    path.write_text(good.replace('stratify_field = "level"', 'stratify_field = "levle"'))
    with pytest.raises(
        DatasetInvalid, match=r"no usable rows, all 6 are bad: .*missing field 'levle' \(stratify_field\)"
    ):
        dataset_problems(load_config(path))


def test_status_checks_the_resource_thresholds_as_the_daemon_does(
    tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's probe is built (and the service imported) only where a threshold is set: one that no
    host meets and one every host meets, read the way the daemon reads them before starting a job."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    upgraded(url).dispose()
    for free, met in (("1B", True), ("1000000GiB", False)):
        extra = f'[scheduling.resources]\nmin_host_free_memory = "{free}"'
        path = str(write_config(tmp_path, url, dataset=dataset, scheduling_extra=extra))
        assert main(["--config", path, "status", "--format", "json"]) == 0
        resources = json.loads(capsys.readouterr().out)["resources"]
        assert resources["met"] is met, resources
        if not met:
            assert resources["unmet"][0].startswith("host: available memory"), resources


def test_a_statement_the_database_refuses_is_one_line_naming_it(
    tmp_path: Path, dataset: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver's error is reported as the CLI's one line (the command imported SQLAlchemy; `main`
    does not need to): a database at the current revision whose tables are gone, not an outage."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    database = upgraded(url)
    with database.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE results")
    database.dispose()
    path = str(write_config(tmp_path, url, dataset=dataset))
    assert main(["--config", path, "results"]) == 1
    assert _errors(capsys) == ["evald: error: StatementFailed: OperationalError: no such table: results"]
