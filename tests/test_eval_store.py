"""``evald eval`` says it stores nothing, ``--store`` stores as the daemon's job would (once for the same run,
step and task), and ``evald results`` tells a known run without results from an unknown one (issue 45:
`evald eval` stored nothing and `results` then said "no run" while `status` listed the run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.cli.eval_storage import task_names
from daemon.config import load_config
from daemon.errors import ConfigError
from storage import queries
from storage.database import Database
from storage.models import JobState
from tests.conftest import ToyRun
from tests.harness import evald, write_config, write_dataset

#: A worker run on a loaded machine: generous, and only ever reached if the command hangs.
EVAL_TIMEOUT = 600


def _config(tmp_path: Path, url: str, toy_run: ToyRun) -> tuple[str, Path]:
    """A config whose run ``toy`` holds a copy of the toy run's last checkpoint at ``step_30``."""
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    path = write_config(tmp_path, url, dataset=data, batch_size=4)
    checkpoint = Path(shutil.copytree(toy_run.last_checkpoint, tmp_path / "run" / "step_30"))
    return str(path), checkpoint


def test_eval_without_store_says_nothing_was_stored_and_results_says_why(
    toy_run: ToyRun, tmp_path: Path, sqlite_url: str
) -> None:
    config, checkpoint = _config(tmp_path, sqlite_url, toy_run)
    assert evald("--config", config, "db", "upgrade").returncode == 0
    done = evald("--config", config, "eval", str(checkpoint), "--format", "json", timeout=EVAL_TIMEOUT)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["stored"] == [] and out["tasks"][0]["n"]["accuracy"] == 4
    notice = done.stderr.strip().splitlines()[-1]
    assert notice.startswith("evald: nothing was stored: without --store `evald eval` only prints")
    assert notice.endswith("add --store to store them as run 'toy''s step 30")

    results = evald("--config", config, "results", "--run", "toy")
    assert results.returncode == 1
    assert results.stderr.strip() == (
        "evald: error: run 'toy' has no stored results: the daemon (`evald run`) stores what it evaluates; "
        "`evald eval` without --store stores nothing (add --store to keep its results)"
    )
    # A run neither configured nor recorded is still unknown, by the same words as before.
    other = evald("--config", config, "results", "--run", "other")
    assert other.returncode == 1 and other.stderr.strip() == "evald: error: no run 'other' (runs: none)"


def test_eval_store_stores_the_job_once_for_its_run_step_and_task(
    toy_run: ToyRun, tmp_path: Path, database: Database, database_url: str
) -> None:
    config, checkpoint = _config(tmp_path, database_url, toy_run)
    first = evald(
        "--config", config, "eval", str(checkpoint), "--store", "--format", "json", timeout=EVAL_TIMEOUT
    )
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    [stored] = out["stored"]
    assert stored | {"job": 0} == {
        "task": "arith",
        "run": "toy",
        "step": 30,
        "checkpoint": "step_30",
        "job": 0,
        "added": True,
    }
    assert "nothing was stored" not in first.stderr
    evaluated = out["tasks"][0]["metrics"]

    listed = evald("--config", config, "results", "--run", "toy", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert {(r["step"], r["task"], r["stage"]) for r in rows} == {(30, "arith", "full")}
    assert {r["metric"]: r["value"] for r in rows} == pytest.approx(
        {k: v for k, v in evaluated.items() if v is not None}
    )
    with database.session() as session:
        [job] = queries.job_rows(session)
        history = queries.job_history(session, stored["job"])
        samples = queries.job_samples(session, run="toy", step=30, task="arith")
    assert (job.id, job.state, job.step) == (stored["job"], JobState.SUCCEEDED, 30)
    assert [(a.outcome, a.attempt, a.batch_size) for a in history] == [("succeeded", 1, 4)]
    assert len(samples.samples) == 4

    again = evald("--config", config, "eval", str(checkpoint), "--store", timeout=EVAL_TIMEOUT)
    assert again.returncode == 0, again.stderr
    assert (
        f"already stored: run 'toy', step 30 (step_30), task 'arith' (job {stored['job']}): nothing added"
        in again.stdout.splitlines()
    )
    relisted = evald("--config", config, "results", "--run", "toy", "--format", "json")
    assert json.loads(relisted.stdout) == rows
    with database.session() as session:
        assert len(queries.job_history(session, stored["job"])) == 1


def test_store_refuses_before_any_worker_runs(
    toy_run: ToyRun, tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where to store is told from the config and the folder first: each refusal names the fix, and no
    worker is started (these return in well under the time a worker takes to load)."""
    config, checkpoint = _config(tmp_path, sqlite_url, toy_run)
    outside = toy_run.last_checkpoint
    assert main(["--config", config, "eval", str(outside), "--store"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"evald: error: --store: {outside} is under no configured run's root (runs: toy): "
        "name the run with --run"
    )
    assert main(["--config", config, "eval", str(checkpoint), "--run", "toy"]) == 2
    assert capsys.readouterr().err.strip() == "evald: --run: names the run to store under: only with --store"
    assert main(["--config", config, "eval", str(checkpoint), "--store", "--run", "nope"]) == 2
    assert capsys.readouterr().err.strip() == "evald: --run: no run 'nope' in the config (runs: toy)"
    root = checkpoint.parent
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / name, root / name)
    assert main(["--config", config, "eval", str(root), "--store"]) == 1
    assert (
        "is run 'toy''s root itself, which the daemon never evaluates: not stored" in capsys.readouterr().err
    )
    # The database is checked before the worker too: a SQLite file never upgraded.
    assert main(["--config", config, "eval", str(checkpoint), "--store"]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("evald: error: ") and "evald db upgrade" in line


def test_store_evaluates_only_the_run_s_own_tasks(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "arith.jsonl", 2)
    path = write_config(
        tmp_path, f"sqlite:///{tmp_path / 'e.db'}", dataset=data, run_extra='tasks = ["arith"]'
    )
    other = f'[[tasks]]\nname = "other"\ndataset = "{data}"\nprompt_field = "problem"\n\n[inference]'
    path.write_text(path.read_text().replace("[inference]", other))
    config = load_config(path)
    run = config.run("toy")
    assert task_names(config, None, None) == ["arith", "other"]
    assert task_names(config, None, run) == ["arith"]
    assert task_names(config, "other", None) == ["other"]
    with pytest.raises(
        ConfigError, match=r"task 'other' is not one of run 'toy''s tasks \(arith\): not stored"
    ):
        task_names(config, "other", run)
    with pytest.raises(ConfigError, match=r"unknown task 'nope' \(defined: arith, other\)"):
        task_names(config, "nope", run)


def test_results_of_a_run_recorded_without_results(
    tmp_path: Path, database: Database, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run the daemon recorded (``status`` lists it) but whose results none stored: said so, whatever the
    filters; a run with results keeps the filters' own messages."""
    data = write_dataset(tmp_path / "arith.jsonl", 2)
    config = str(write_config(tmp_path, database_url, dataset=data))
    with database.session() as session:
        queries.ensure_run(session, "toy", str(tmp_path / "run"))
    for filters in ([], ["--metric", "accuracy"], ["--task", "arith", "--steps", "0:10"]):
        assert main(["--config", config, "results", "--run", "toy", *filters]) == 1
        assert capsys.readouterr().err.strip().startswith("evald: error: run 'toy' has no stored results: ")
