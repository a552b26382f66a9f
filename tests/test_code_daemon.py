"""A ``kind = "code"`` task through the daemon, beside a math task on the same checkpoint (issue 34): the
config takes a ``[tasks.code]`` table and ``evald config check`` reads the code dataset with the worker's
reader; the results (pass@1, the verdict rates) are stored, and ``evald samples`` shows each failing sample's
verdict, its tests passed of the total, the failing test and what the program wrote. On SQLite and
PostgreSQL. The model's code is the row's prefix with the toy model's answer appended after a ``#``
(see tests/test_code_worker.py), so the verdicts are known."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from storage import queries
from tests.conftest import ToyRun
from tests.harness import (
    all_jobs_done,
    evald,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.test_code_worker import PREFIXES, VERDICTS

CODE_TASK = """
[[tasks]]
name = "code"
kind = "code"
dataset = "{dataset}"
prompt_field = "problem"
id_field = "id"
prompt_template = "{{prompt}}="
max_new_tokens = 12
metrics = ["pass@1", "test_pass_rate", "wrong_answer_rate", "timeout_rate", "compile_error_rate"]

[tasks.code]
extract = "append"
prefix_field = "prefix"
parallel = 2

[tasks.code.limits]
cpu_s = 1
wall_s = 5
memory_mb = 256
"""


def _code_dataset(path: Path) -> Path:
    rows = [
        {"id": name, "problem": "2+4", "prefix": prefix, "tests": [{"input": "", "output": "6\n"}]}
        for name, prefix in PREFIXES.items()
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_code_task_beside_a_math_task_is_stored_and_shown(
    toy_run: ToyRun, tmp_path: Path, database_url: str
) -> None:
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "arith.jsonl", 8))
    code = _code_dataset(tmp_path / "code.jsonl")
    with config.open("a", encoding="utf-8") as f:
        f.write(CODE_TASK.format(dataset=code))
    checked = evald("config", "check", str(config))
    assert checked.returncode == 0, checked.stderr
    database = upgraded(database_url)
    shutil.copytree(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        done = wait_for(lambda: all_jobs_done(database, 2), 300, "both tasks evaluated", daemon.process)
        assert daemon.stop() == 0
    assert sorted((j.task, j.state) for j in done) == [("arith", "succeeded"), ("code", "succeeded")]
    with database.session() as session:
        stored = {r.metric: r.value for r in queries.result_rows(session, task="code")}
    assert stored == pytest.approx(
        {
            "pass@1": 0.2,
            "test_pass_rate": 0.2,
            "wrong_answer_rate": 0.2,
            "timeout_rate": 0.2,
            "compile_error_rate": 0.2,
        }
    )
    base = ("--config", str(config), "samples", "--run", "toy", "--step", "10", "--task")
    shown = evald(*base, "code", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    samples = {s["prompt_id"]: s for s in json.loads(shown.stdout)["samples"]}
    assert {name: samples[name]["verdict"] for name in PREFIXES} == VERDICTS
    wrong = samples["wrong"]
    assert (wrong["tests_passed"], wrong["tests_total"], wrong["verdicts"]) == (0, 1, {"wrong_answer": 1})
    assert (wrong["failed_test"], wrong["failed_output"]) == ("input:\n\nexpected:\n6\n", "5\n")
    # The math task's samples keep the JSON they always had: no code fields.
    math = json.loads(evald(*base, "arith", "--format", "json").stdout)["samples"]
    assert math and all("verdict" not in s for s in math)
    text = evald(*base, "code", env={"COLUMNS": "200"}).stdout
    assert "tests" in text.splitlines()[1].split(), text
    failed = [line for line in text.splitlines() if line.startswith("sample ")]
    assert len(failed) == 4, text
    assert any("failed wrong_answer: test: input: expected: 6 | output: 5" in line for line in failed), text
    database.dispose()
