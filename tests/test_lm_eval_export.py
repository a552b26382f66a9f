"""``evald export lm-eval`` against lm-eval itself: the same group task (``arith_suite``: generate and
rolling perplexity) on the same toy checkpoint, run by the ``lm_eval`` command and by an evald worker; the
exported file has lm-eval's keys at every depth, the same numbers, and lm-eval's own readers (its results
schema, ``make_table``) read it as they read lm-eval's file."""

from __future__ import annotations

import json
import os
import subprocess
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from daemon.cli import main
from daemon.config import Config, DaemonConfig, InferenceConfig, RunConfig, TaskConfig
from daemon.running.runner import JobRunner
from storage import queries
from storage.models import CheckpointState
from tests.conftest import ToyRun
from tests.deadlines import Deadline, patient
from tests.forkserver import worker_python
from tests.harness import upgraded

pytestmark = pytest.mark.slow

TOY_TASKS = Path(__file__).resolve().parent.parent / "inference" / "toy" / "lm_eval"
LIMIT = 5
BATCH = 16
#: The one top-level key evald adds (run, step, checkpoint); lm-eval's readers ignore it.
OURS_ONLY = {"evald"}


def _keys(value: Any, path: str = "") -> Iterator[str]:
    """Every key path of a JSON document (lists walked by position)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield f"{path}/{key}"
            yield from _keys(inner, f"{path}/{key}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _keys(inner, f"{path}[{index}]")


def _lm_eval_command(checkpoint: Path, out: Path) -> subprocess.Popen[str]:
    command = [
        worker_python(), "-m", "lm_eval", "--model", "hf",
        "--model_args", f"pretrained={checkpoint},dtype=float32", "--device", "cpu",
        "--tasks", "arith_suite", "--include_path", str(TOY_TASKS), "--limit", str(LIMIT),
        "--batch_size", str(BATCH), "--output_path", str(out),
    ]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, cwd=TOY_TASKS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _drive(runner: JobRunner, timeout: float = 400) -> None:
    deadline = Deadline(timeout)
    while not deadline.expired():
        runner.poll()
        if not runner.running and not runner.claim_and_start():
            return
        time.sleep(0.05)
    raise AssertionError("the job did not end in time")


@pytest.fixture(scope="module")
def documents(
    toy_run: ToyRun, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(lm-eval's file, evald's export) for arith_suite at limit 5 on the toy's last checkpoint."""
    tmp = tmp_path_factory.mktemp("lm-eval-export")
    checkpoint = toy_run.last_checkpoint
    # The command runs while evald's worker evaluates (two processes, one thread each).
    command = _lm_eval_command(checkpoint, tmp / "cli")
    try:
        url = f"sqlite:///{tmp / 'evald.db'}"
        database = upgraded(url)
        task = TaskConfig(
            name="suite",
            kind="lm_eval",
            lm_eval_task="arith_suite",
            lm_eval_include_path=TOY_TASKS,
            limit=LIMIT,
            batch_size=BATCH,
        )
        config = Config(
            runs=(RunConfig(name="r", root=checkpoint.parent),),
            tasks=(task,),
            inference=InferenceConfig(engine="hf", threads=1, python=Path(worker_python())),
            daemon=DaemonConfig(state_dir=tmp / "state"),
        )
        with database.session() as s:
            run_id = queries.ensure_run(s, "r", str(checkpoint.parent))
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
            queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=30, tasks=["suite"])
        try:
            _drive(JobRunner(config, database, "test:1"))
            with database.session() as s:
                (job,) = queries.job_rows(s)
        finally:
            database.dispose()
        assert job.state == "succeeded", job.error
        toml = tmp / "evald.toml"
        toml.write_text(
            f'[database]\nurl = "{url}"\n\n[[runs]]\nname = "r"\nroot = "{checkpoint.parent}"\n\n'
            f'[inference]\nengine = "hf"\n\n[[tasks]]\nname = "suite"\nkind = "lm_eval"\n'
            f'lm_eval_task = "arith_suite"\nlm_eval_include_path = "{TOY_TASKS}"\n'
            f"limit = {LIMIT}\nbatch_size = {BATCH}\n"
        )
        out = tmp / "ours.json"
        args = ["--config", str(toml), "export", "lm-eval", "--run", "r", "--step", "30", "--out", str(out)]
        assert main(args) == 0
        ours = json.loads(out.read_text(encoding="utf-8"))
        output = command.communicate(timeout=patient(600))[0]
    finally:
        if command.poll() is None:
            command.kill()
            command.communicate()
    assert command.returncode == 0, output[-3000:]
    (written,) = (tmp / "cli").rglob("results_*.json")
    theirs = json.loads(written.read_text(encoding="utf-8"))
    return theirs, ours


@pytest.mark.long
def test_the_export_has_lm_evals_keys_at_every_depth(
    documents: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    theirs, ours = documents
    assert set(ours) - set(theirs) == OURS_ONLY
    assert set(theirs) - set(ours) == set()
    # Every key path below the top, recursively: results and the group's own entry, configs as lm-eval
    # parses them, versions and n-shot of the group, the run's config. None missing, none extra.
    mine = {k for k in _keys(ours) if not k.startswith("/evald")}
    assert sorted(mine - set(_keys(theirs))) == []
    assert sorted(set(_keys(theirs)) - mine) == []
    assert "groups" not in ours  # arith_suite aggregates nothing: lm-eval writes no "groups"


@pytest.mark.long
def test_the_export_says_what_lm_eval_says(documents: tuple[dict[str, Any], dict[str, Any]]) -> None:
    theirs, ours = documents
    # The checkpoint's path, not its folder name.
    assert ours["model_name"] == theirs["model_name"]
    assert ours["config"]["model_args"] == theirs["config"]["model_args"]
    assert ours["model_name_sanitized"] == theirs["model_name_sanitized"]
    for key in ("group_subtasks", "versions", "n-shot", "higher_is_better", "n-samples", "configs"):
        assert ours[key] == theirs[key], key
    # The same numbers: lm-eval's own run inside evald's worker, on the same documents.
    for task in ("arith", "arith_ppl", "arith_suite"):
        for key, value in theirs["results"][task].items():
            mine = ours["results"][task][key]
            if isinstance(value, float):
                assert mine == pytest.approx(value, rel=1e-9), (task, key)
            else:
                assert mine == value, (task, key)
    for key in (
        "model_num_parameters",
        "model_dtype",
        "model_revision",
        "model_sha",
        "batch_size",
        "limit",
        "device",
        "bootstrap_iters",
    ):
        assert ours["config"][key] == theirs["config"][key], key
    for key in (
        "tokenizer_pad_token",
        "tokenizer_eos_token",
        "tokenizer_bos_token",
        "eot_token_id",
        "max_length",
    ):
        assert ours[key] == theirs[key], key
    assert ours["lm_eval_version"] == theirs["lm_eval_version"]
    assert ours["task_hashes"] == {} == theirs["task_hashes"]
    assert ours["evald"] == {
        "run": "r",
        "step": 30,
        "checkpoint": theirs["model_name"],
        "tasks": ["suite"],
    }


def test_lm_evals_own_readers_read_the_export(documents: tuple[dict[str, Any], dict[str, Any]]) -> None:
    from lm_eval.result_schema import EvalResults
    from lm_eval.utils import make_table

    theirs, ours = documents
    # lm-eval's schema of its results file (``EvalResults``), key by key: wherever lm-eval's own file
    # satisfies it, ours does too (its own file breaks it in ``configs`` and "N/A" stderrs, so must ours).
    # ``git_hash`` is the one left null on purpose: evald does not know the commit at evaluation time.
    checked = []
    for key, annotation in typing.get_type_hints(EvalResults).items():
        if key not in theirs or key == "git_hash":
            continue
        adapter = TypeAdapter(annotation)
        try:
            adapter.validate_python(theirs[key])
        except ValidationError:
            continue
        adapter.validate_python(ours[key])
        checked.append(key)
    assert {"n-samples", "versions", "n-shot", "higher_is_better", "config", "max_length"} <= set(checked)
    # The table the lm_eval command prints from its results: the same rows, values and all.
    assert make_table(ours) == make_table(theirs)
