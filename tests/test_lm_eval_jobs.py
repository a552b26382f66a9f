"""``kind = "lm_eval"`` tasks: checked at config load, run by real workers under the job runner (a task
that raises inside lm-eval fails its job with the reason, the next job still runs), and exported in
lm-eval's results shape."""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.config import Config, DaemonConfig, InferenceConfig, RunConfig, TaskConfig, parse_config
from daemon.errors import ConfigError
from daemon.running.runner import JobRunner
from storage import queries
from storage.models import CheckpointState
from tests.conftest import ToyRun
from tests.harness import upgraded

# Starts real worker processes (the config tests are quick, the runner test is not).
pytestmark = pytest.mark.slow

TOY_TASKS = Path(__file__).resolve().parent.parent / "inference" / "toy" / "lm_eval"


def _config_error(text: str, tmp_path: Path) -> str:
    source = f'[[runs]]\nname = "r"\nroot = "{tmp_path}"\n\n[[tasks]]\nname = "t"\n{text}\n'
    with pytest.raises(ConfigError) as caught:
        parse_config(tomllib.loads(source), base_dir=tmp_path, source="evald.toml")
    return "\n".join(caught.value.problems)


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ('kind = "lm_eval"\nlm_eval_task = "no_such_task_anywhere"', "lm_eval_task: unknown lm-eval task"),
        ('kind = "lm_eval"\nlm_eval_task = "arith"\nlm_eval_include_path = "nowhere"', "folder not found"),
        ('kind = "lm_eval"\nlm_eval_task = "arith"\ndataset = "d.jsonl"', "dataset: not for kind"),
        ('kind = "lm_eval"', "lm_eval_task: kind"),
        ('dataset = "d.jsonl"\nlm_eval_task = "arith"', 'lm_eval_task: only for kind = "lm_eval"'),
    ],
)
def test_bad_lm_eval_settings_are_config_errors_naming_the_field(
    task: str, expected: str, tmp_path: Path
) -> None:
    (tmp_path / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    assert expected in _config_error(task, tmp_path)


def test_a_yaml_that_does_not_parse_is_named(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "bad.yaml").write_text("task: bad\ndoc_to_text: [unclosed\n")
    problems = _config_error(
        'kind = "lm_eval"\nlm_eval_task = "bad"\nlm_eval_include_path = "tasks"', tmp_path
    )
    assert "unknown lm-eval task 'bad'" in problems and "bad.yaml does not load" in problems


def test_an_lm_eval_task_may_run_on_a_worker_group(tmp_path: Path) -> None:
    # tp × dp > 1 is accepted: every rank runs lm-eval (tests/test_lm_eval_group.py runs it).
    source = (
        f'[[runs]]\nname = "r"\nroot = "{tmp_path}"\n\n[inference]\ntp = 2\ndp = 2\n\n[[tasks]]\n'
        f'name = "t"\nkind = "lm_eval"\nlm_eval_task = "arith"\nlm_eval_include_path = "{TOY_TASKS}"\n'
    )
    config = parse_config(tomllib.loads(source), base_dir=tmp_path, source="evald.toml")
    assert config.inference.tp * config.inference.dp == 4


def _drive(runner: JobRunner, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runner.poll()
        if not runner.running and not runner.claim_and_start():
            return
        time.sleep(0.05)
    raise AssertionError("the jobs did not end in time")


def test_a_task_raising_in_lm_eval_fails_its_job_and_the_next_one_runs_and_exports(
    toy_run: ToyRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    database = upgraded(url)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    shipped = (TOY_TASKS / "arith.yaml").read_text(encoding="utf-8")
    broken = shipped.replace("task: arith", "task: arith_broken").replace(
        "test_split: test", "test_split: test\nprocess_docs: !function broken.explode"
    )
    (tasks / "arith_broken.yaml").write_text(
        broken.replace("../data/arith500.jsonl", str(TOY_TASKS.parent / "data" / "arith500.jsonl"))
    )
    (tasks / "broken.py").write_text(
        "def explode(dataset):\n    raise RuntimeError('boom in process_docs')\n"
    )
    config = Config(
        runs=(RunConfig(name="r", root=tmp_path / "run"),),
        tasks=(
            TaskConfig(
                name="broken", kind="lm_eval", lm_eval_task="arith_broken", lm_eval_include_path=tasks
            ),
            TaskConfig(
                name="arith-lm",
                kind="lm_eval",
                lm_eval_task="arith",
                lm_eval_include_path=TOY_TASKS,
                limit=10,
            ),
        ),
        inference=InferenceConfig(engine="hf", threads=1),
        daemon=DaemonConfig(state_dir=tmp_path / "state"),
    )
    checkpoint = toy_run.last_checkpoint
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(tmp_path / "run"))
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=str(checkpoint),
            name=checkpoint.name,
            step=30,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=30, tasks=["broken", "arith-lm"])

    _drive(JobRunner(config, database, "test:1"))

    with database.session() as s:
        by_task = {job.task: job for job in queries.job_rows(s)}
        rows = queries.result_rows(s, run="r")
    assert by_task["broken"].state == "failed"
    assert "boom in process_docs" in (by_task["broken"].error or "")
    assert by_task["arith-lm"].state == "succeeded"
    stored = {r.metric: r for r in rows if r.task == "arith-lm"}
    assert set(stored) == {"exact_match_strict", "exact_match_flexible"}
    assert stored["exact_match_strict"].n == 10

    # The export reads back lm-eval's own keys.
    toml = tmp_path / "evald.toml"
    toml.write_text(
        f'[database]\nurl = "{url}"\n\n[[runs]]\nname = "r"\nroot = "{tmp_path / "run"}"\n\n'
        f'[inference]\nengine = "hf"\n\n[[tasks]]\nname = "arith-lm"\nkind = "lm_eval"\n'
        f'lm_eval_task = "arith"\n'
        f'lm_eval_include_path = "{TOY_TASKS}"\nlimit = 10\n'
    )
    out = tmp_path / "results.json"
    assert (
        main(["--config", str(toml), "export", "lm-eval", "--run", "r", "--step", "30", "--out", str(out)])
        == 0
    )
    exported = json.loads(out.read_text())
    assert exported["results"]["arith"]["exact_match,strict-match"] == stored["exact_match_strict"].value
    assert "exact_match_stderr,flexible-extract" in exported["results"]["arith"]
    assert exported["n-samples"]["arith"]["effective"] == 10
    assert exported["versions"]["arith"] == 1.0
    assert exported["configs"]["arith"]["output_type"] == "generate_until"
    assert main(["--config", str(toml), "export", "lm-eval", "--run", "r", "--step", "15"]) == 1
    assert "steps with results: 30" in capsys.readouterr().err
