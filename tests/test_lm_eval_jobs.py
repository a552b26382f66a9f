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
from tests.deadlines import Deadline
from tests.forkserver import worker_python
from tests.harness import evald, upgraded
from tests.lm_eval_tasks import colliding_python_task, colliding_yaml

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


COLLISION = (
    "lm-eval keys 'exact_match,boxed-digits' and 'exact_match,boxed_digits' (filters 'boxed-digits' and "
    "'boxed_digits' of metric 'exact_match') both map to evald metric 'exact_match_boxed_digits'"
)


def test_filters_that_map_to_one_metric_name_are_refused_naming_the_task_both_filters_and_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = colliding_yaml(tmp_path / "tasks")
    problems = _config_error(
        'kind = "lm_eval"\nlm_eval_task = "arith_boxed"\nlm_eval_include_path = "tasks"', tmp_path
    )
    assert f"lm_eval_task: lm-eval task 'arith_boxed' ({tasks / 'arith_boxed.yaml'}): {COLLISION}" in problems
    # A group is refused for its member, and config check (as evald run's start-up) says so and exits 2.
    (tasks / "suite.yaml").write_text("group: boxed_suite\ntask:\n  - arith_boxed\n")
    toml = tmp_path / "evald.toml"
    toml.write_text(
        f'[[runs]]\nname = "r"\nroot = "{tmp_path}"\n\n[[tasks]]\nname = "good"\nkind = "lm_eval"\n'
        f'lm_eval_task = "arith"\nlm_eval_include_path = "{TOY_TASKS}"\n\n[[tasks]]\nname = "suite"\n'
        f'kind = "lm_eval"\nlm_eval_task = "boxed_suite"\nlm_eval_include_path = "{tasks}"\n'
    )
    assert main(["config", "check", str(toml)]) == 2
    error = capsys.readouterr().err
    assert "tasks[1]: lm_eval_task: lm-eval task 'arith_boxed'" in error and COLLISION in error
    assert "tasks[0]" not in error
    started = evald("--config", str(toml), "run", timeout=120)
    assert started.returncode == 2 and COLLISION in started.stderr


def test_an_inline_group_member_and_a_function_metric_are_checked_too(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    # An inline task over a clean one, adding a filter "strict" beside "strict-match" (short name: strict).
    (tasks / "suite.yaml").write_text(
        "group: suite\ntask:\n  - task: arith\n    filter_list:\n"
        "      - name: strict-match\n        filter: [{function: take_first}]\n"
        "      - name: strict\n        filter: [{function: take_first}]\n"
    )
    (tasks / "arith.yaml").write_text((TOY_TASKS / "arith.yaml").read_text())
    problems = _config_error(
        'kind = "lm_eval"\nlm_eval_task = "suite"\nlm_eval_include_path = "tasks"', tmp_path
    )
    assert "'exact_match,strict-match' and 'exact_match,strict'" in problems
    assert "evald metric 'exact_match_strict'" in problems
    # A metric given as a !function is named by its function: score_x beside score with filter "x".
    (tasks / "suite.yaml").unlink()
    (tasks / "fn.yaml").write_text(
        "task: fn\ndataset_path: json\noutput_type: generate_until\ndoc_to_text: q\ndoc_to_target: a\n"
        "filter_list:\n  - name: none\n    filter: [{function: take_first}]\n"
        "  - name: x\n    filter: [{function: take_first}]\n"
        "metric_list:\n  - metric: !function utils.score_x\n  - metric: score\n"
    )
    problems = _config_error(
        'kind = "lm_eval"\nlm_eval_task = "fn"\nlm_eval_include_path = "tasks"', tmp_path
    )
    assert "'score_x,none' and 'score,x'" in problems and "evald metric 'score_x'" in problems


def test_the_shipped_toy_tasks_have_no_colliding_names(tmp_path: Path) -> None:
    for name in ("arith", "arith_ppl", "arith_suite"):
        source = (
            f'[[runs]]\nname = "r"\nroot = "{tmp_path}"\n\n[[tasks]]\nname = "t"\nkind = "lm_eval"\n'
            f'lm_eval_task = "{name}"\nlm_eval_include_path = "{TOY_TASKS}"\n'
        )
        parse_config(tomllib.loads(source), base_dir=tmp_path, source="evald.toml")


def test_metric_values_refuses_two_keys_of_one_name() -> None:
    from inference.errors import TaskInvalid
    from inference.harness.report import metric_values

    good = {"results": {"arith": {"alias": "arith", "acc,none": 0.5, "acc_stderr,none": 0.1}}}
    assert [m.name for m in metric_values(good)] == ["acc"]
    both = {"results": {"arith": {"exact_match,boxed-digits": 1.0, "exact_match,boxed_digits": 0.0}}}
    with pytest.raises(TaskInvalid) as caught:
        metric_values(both)
    assert caught.value.message == f"lm-eval task 'arith': {COLLISION}, so one result would be lost: " + (
        "rename one in the task's YAML"
    )


def test_eval_command_fails_a_task_whose_code_adds_colliding_filters(
    toy_run: ToyRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # config check cannot see a Python task's filters: lm-eval runs, and the mapping refuses its results.
    tasks = colliding_python_task(tmp_path / "tasks")
    toml = tmp_path / "evald.toml"
    toml.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path / "e.db"}"\n\n[[runs]]\nname = "r"\nroot = "{tmp_path}"\n\n'
        '[inference]\nengine = "hf"\nthreads = 1\n\n[[tasks]]\nname = "coded"\nkind = "lm_eval"\n'
        f'lm_eval_task = "arith_boxed_py"\nlm_eval_include_path = "{tasks}"\nlimit = 2\nbatch_size = 2\n'
    )
    assert main(["config", "check", str(toml)]) == 0
    capsys.readouterr()
    assert main(["--config", str(toml), "eval", str(toy_run.last_checkpoint), "--format", "json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"task 'coded': lm-eval task 'arith_boxed_py': {COLLISION}" in captured.err


def test_an_lm_eval_task_may_run_on_a_worker_group(tmp_path: Path) -> None:
    # tp × dp > 1 is accepted: every rank runs lm-eval (tests/test_lm_eval_group.py runs it).
    source = (
        f'[[runs]]\nname = "r"\nroot = "{tmp_path}"\n\n[inference]\ntp = 2\ndp = 2\n\n[[tasks]]\n'
        f'name = "t"\nkind = "lm_eval"\nlm_eval_task = "arith"\nlm_eval_include_path = "{TOY_TASKS}"\n'
    )
    config = parse_config(tomllib.loads(source), base_dir=tmp_path, source="evald.toml")
    assert config.inference.tp * config.inference.dp == 4


def _drive(runner: JobRunner, timeout: float = 400) -> None:
    deadline = Deadline(timeout)
    while not deadline.expired():
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
        inference=InferenceConfig(engine="hf", threads=1, python=Path(worker_python())),
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


def test_an_lm_eval_job_leaves_out_the_environment_report_it_would_discard() -> None:
    # simple_evaluate's add_env_info runs pip, nvidia-smi and compilers as subprocesses for a report that
    # the job never keeps; it is left out while the job evaluates and lm-eval's own comes back after.
    import lm_eval.evaluator

    from inference.harness.evaluation import _no_environment_report

    before = lm_eval.evaluator.add_env_info
    results: dict[str, object] = {"results": {}}
    with _no_environment_report():
        lm_eval.evaluator.add_env_info(results)
    assert results == {"results": {}}
    assert lm_eval.evaluator.add_env_info is before
