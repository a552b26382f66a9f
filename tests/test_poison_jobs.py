"""One poison job beside good ones, under a real ``evald run``: it fails with an error naming what is wrong,
the good jobs beside it are evaluated, and the daemon goes on (SQLite and PostgreSQL).

The poison here is an lm-eval task whose two filters map to one evald metric name (``boxed-digits`` and
``boxed_digits``). ``config check`` refuses it where the YAML says so (tests/test_lm_eval_jobs.py); these
are the cases it cannot know when the daemon starts: filters chosen by a Python task's code, and a YAML
edited after the config was loaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from storage import queries
from tests.conftest import ToyRun
from tests.harness import all_jobs_done, running_daemon, upgraded, wait_for
from tests.lm_eval_tasks import TOY_TASKS, colliding_python_task, colliding_yaml

pytestmark = pytest.mark.slow

CONFIG = """\
[database]
url = "{url}"

[[runs]]
name = "toy"
root = "{root}"

[[tasks]]
name = "coded"
kind = "lm_eval"
lm_eval_task = "arith_boxed_py"
lm_eval_include_path = "{coded}"
limit = 2
batch_size = 4

[[tasks]]
name = "edited"
kind = "lm_eval"
lm_eval_task = "arith_boxed"
lm_eval_include_path = "{edited}"
limit = 2
batch_size = 4

[[tasks]]
name = "good"
kind = "lm_eval"
lm_eval_task = "arith"
lm_eval_include_path = "{good}"
limit = 2
batch_size = 4

[inference]
engine = "hf"
threads = 1

[scheduling]
quiet_secs = 0.5
invalid_after_secs = 30
tick_secs = 0.05
heartbeat_secs = 1.0
lease_secs = 5.0

[daemon]
state_dir = "{state}"
log_format = "json"
"""

BOTH_FILTERS = (
    "lm-eval keys 'exact_match,boxed-digits' and 'exact_match,boxed_digits'",
    "evald metric 'exact_match_boxed_digits'",
)


def test_a_task_whose_filters_collide_fails_its_jobs_and_the_good_task_beside_it_is_evaluated(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    root = tmp_path / "run"
    root.mkdir()
    coded = colliding_python_task(tmp_path / "coded")
    # Clean when the daemon loads its config (config check would refuse it otherwise); the user adds the
    # colliding filters while it runs.
    edited = colliding_yaml(tmp_path / "edited-later")
    clean = tmp_path / "edited"
    clean.mkdir()
    shutil.copy(TOY_TASKS / "arith.yaml", clean / "arith_boxed.yaml")
    (clean / "arith_boxed.yaml").write_text(
        (clean / "arith_boxed.yaml")
        .read_text()
        .replace("task: arith", "task: arith_boxed")
        .replace("../data/", f"{TOY_TASKS.parent / 'data'}/")
    )
    config = tmp_path / "evald.toml"
    config.write_text(
        CONFIG.format(
            url=database_url, root=root, good=TOY_TASKS, coded=coded, edited=clean, state=tmp_path / "state"
        )
    )
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        shutil.copy(edited / "arith_boxed.yaml", clean / "arith_boxed.yaml")
        # One checkpoint: its poison jobs come first (the config's task order), the good one after them.
        shutil.copytree(toy_run.last_checkpoint, root / toy_run.last_checkpoint.name)
        rows = wait_for(lambda: all_jobs_done(database, 3), 600, "every job ended", daemon.process)
        assert daemon.process.poll() is None
        assert daemon.stop() == 0

    step = int(toy_run.last_checkpoint.name.removeprefix("step_"))
    by_task = {job.task: job for job in rows}
    assert len(rows) == 3 and {job.step for job in rows} == {step}
    assert by_task["good"].state == "succeeded"
    for task in ("coded", "edited"):
        error = by_task[task].error
        assert by_task[task].state == "failed" and error is not None, task
        assert all(part in error for part in BOTH_FILTERS), error
    with database.session() as session:
        results = queries.result_rows(session, run="toy")
    assert {(r.task, r.metric) for r in results} == {
        ("good", "exact_match_strict"),
        ("good", "exact_match_flexible"),
    }

    # One clear line per failed job names it and both filters; no traceback from the store.
    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    failed = [e for e in events if e.get("event") == "job.failed"]
    assert sorted((e["task"], e["step"]) for e in failed) == [("coded", step), ("edited", step)]
    assert all(BOTH_FILTERS[0] in str(e.get("error")) for e in failed), failed
    assert "IntegrityError" not in log.read_text()
    database.dispose()
