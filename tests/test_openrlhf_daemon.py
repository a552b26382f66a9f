"""OpenRLHF end to end (issue 23): its two save paths, written by the real DeepSpeed engine (ZeRO-3, two
ranks), watched by a live ``evald run``: each step is evaluated once (in its HF export, the default
preference), the engine tag is recorded as its alternate, and what is stored for each step equals the
source: ``evald eval`` on the writer's own ``global_stepN_hf`` (``save_pretrained`` of the weights the
engine held at step N, in the session's cached writer output, not the copy the daemon watched). ``evald
eval`` on the engine's save_dir (``_actor``, which holds ``latest``) follows ``latest`` and scores the same.
The same for verl's ``global_step_N/actor`` with ``actor/huggingface``, against the model verl saved."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from storage import queries
from tests.cases import verl
from tests.harness import (
    all_jobs_done,
    evald,
    jobs,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.writers.launch import deepspeed_run

pytestmark = pytest.mark.slow

SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
#: What varies from one evaluation of the same weights to the next: time, throughput, memory.
TIMING = re.compile(r"tokens_per_s|wall_s|load_s|peak_memory_mb|latency_p[0-9]+_s")


def _deterministic(metrics: dict[str, float]) -> dict[str, float]:
    kept = {name: value for name, value in metrics.items() if not TIMING.fullmatch(name)}
    assert "accuracy" in kept and "response_length" in kept, metrics
    return kept


def _evaluated(config: Path, checkpoint: Path) -> dict[str, float]:
    """The deterministic metrics of ``evald eval`` on ``checkpoint``: the same task, the same worker."""
    done = evald("--config", str(config), "eval", str(checkpoint), "--format", "json", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [task] = json.loads(done.stdout)["tasks"]
    return _deterministic(task["metrics"])


def _stored(results: list[queries.ResultRow], step: int) -> dict[str, float]:
    return _deterministic({r.metric: r.value for r in results if r.step == step and r.task == "arith"})


@pytest.fixture(scope="module")
def openrlhf_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, float]]]:
    """The session's cached OpenRLHF writer output, and each step's metrics from its HF export."""
    tmp = tmp_path_factory.mktemp("openrlhf-source")
    written = deepspeed_run(3, tmp / "written" / "ckpt")
    url = f"sqlite:///{tmp / 'evald.db'}"
    upgraded(url).dispose()
    config = write_config(tmp, url, dataset=write_dataset(tmp / "arith.jsonl", 6))
    return written, {step: _evaluated(config, written / f"global_step{step}_hf") for step in (1, 2)}


def _save_step(written: Path, root: Path, step: int) -> None:
    """What OpenRLHF's ``save_checkpoint`` leaves for one step, in its order: the engine tag (shards,
    DeepSpeed's scripts, ``latest``), then ``strategy.save_model``'s ``global_stepN_hf``."""
    actor = root / "_actor"
    actor.mkdir(parents=True, exist_ok=True)
    shutil.copytree(written / "_actor" / f"global_step{step}", actor / f"global_step{step}")
    for script in SCRIPTS:
        shutil.copy2(written / "_actor" / script, actor / script)
    (actor / "latest").write_text(f"global_step{step}")
    shutil.copytree(written / f"global_step{step}_hf", root / f"global_step{step}_hf")


@pytest.mark.long
def test_each_openrlhf_step_is_evaluated_once_equal_to_the_source_and_eval_follows_latest(
    tmp_path: Path, sqlite_url: str, openrlhf_source: tuple[Path, dict[int, dict[str, float]]]
) -> None:
    written, source = openrlhf_source
    dataset = write_dataset(tmp_path / "arith.jsonl", 6)
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=dataset)
    root = tmp_path / "run"
    _save_step(written, root, 1)  # there before the start
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        wait_for(lambda: all_jobs_done(database, 1), 180, "step 1 evaluated", daemon.process)
        _save_step(written, root, 2)  # written while it runs
        rows = wait_for(lambda: all_jobs_done(database, 2), 180, "step 2 evaluated", daemon.process)
        assert daemon.stop() == 0
    assert sorted((j.step, j.state, j.attempts) for j in rows) == [(1, "succeeded", 1), (2, "succeeded", 1)]
    with database.session() as s:
        alternates = {a.name: a.of for a in queries.alternate_rows(s)}
        checkpoints = {c.name: c.state for c in queries.checkpoint_rows(s)}
        results = queries.result_rows(s)
    # Step 1 was all there at the start: the HF export is taken. Step 2 arrived shape by shape: whichever
    # was taken, the other is its alternate.
    assert checkpoints["global_step1_hf"] == "ready" and "_actor/global_step1" not in checkpoints
    assert alternates["_actor/global_step1"] == "global_step1_hf"
    assert len(checkpoints) == 2 and len(alternates) == 2
    assert {alternates.get("_actor/global_step2"), alternates.get("global_step2_hf")} - {None} <= set(
        checkpoints
    )
    assert sorted(j.step or 0 for j in jobs(database)) == [1, 2]
    # Each step's stored metrics are the source's, whichever shape was evaluated.
    assert {step: _stored(results, step) for step in (1, 2)} == source
    # evald eval on the save_dir follows latest (global_step2): the same again.
    assert _evaluated(config, root / "_actor") == source[2]
    database.dispose()


@pytest.mark.long
def test_both_shapes_there_at_the_start_with_a_marker_are_one_checkpoint_per_step_equal_to_the_source(
    tmp_path: Path, sqlite_url: str, openrlhf_source: tuple[Path, dict[int, dict[str, float]]]
) -> None:
    """A marker means no quiet period: every shape of both steps is ready at the start-up scan's first
    look (which meets ``_actor/global_stepN`` first). Each step is still evaluated once, in its HF export."""
    written, source = openrlhf_source
    dataset = write_dataset(tmp_path / "arith.jsonl", 6)
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=dataset, run_extra='marker = "COMPLETE"')
    root = tmp_path / "run"
    for step in (1, 2):
        _save_step(written, root, step)
        for folder in (root / "_actor" / f"global_step{step}", root / f"global_step{step}_hf"):
            (folder / "COMPLETE").touch()
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        rows = wait_for(lambda: all_jobs_done(database, 2), 180, "both steps evaluated", daemon.process)
        assert daemon.stop() == 0
    assert sorted((j.checkpoint, j.step, j.state, j.attempts) for j in rows) == [
        ("global_step1_hf", 1, "succeeded", 1),
        ("global_step2_hf", 2, "succeeded", 1),
    ]
    assert len(jobs(database)) == 2
    with database.session() as s:
        alternates = {a.name: a.of for a in queries.alternate_rows(s)}
        checkpoints = {c.name: c.state for c in queries.checkpoint_rows(s)}
        results = queries.result_rows(s)
    assert checkpoints == {"global_step1_hf": "ready", "global_step2_hf": "ready"}
    assert alternates == {"_actor/global_step1": "global_step1_hf", "_actor/global_step2": "global_step2_hf"}
    assert {step: _stored(results, step) for step in (1, 2)} == source
    database.dispose()


@pytest.mark.long
def test_a_verl_step_with_its_huggingface_export_is_one_checkpoint_evaluated_once(
    tmp_path: Path, sqlite_url: str
) -> None:
    """verl saves a step as ``global_step_N/actor/`` (FSDP shards) with ``actor/huggingface/`` inside it
    (``save_contents`` with ``hf_model``): one checkpoint, one job, nothing ignored or alternate, and
    its result equals the model verl saved (``actor/huggingface``, evaluated on its own)."""
    case = verl.build(tmp_path / "written")
    dataset = write_dataset(tmp_path / "arith.jsonl", 6)
    database = upgraded(sqlite_url)
    config = write_config(tmp_path, sqlite_url, dataset=dataset)
    root = tmp_path / "run"
    with running_daemon(config, tmp_path / "daemon.log") as daemon:
        for path in case.order:  # in verl's order, the tracker last
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(case.source / path, target)
        rows = wait_for(lambda: all_jobs_done(database, 1), 180, "the step evaluated", daemon.process)
        assert daemon.stop() == 0
    assert [(j.checkpoint, j.step, j.state) for j in rows] == [("global_step_2", 2, "succeeded")]
    with database.session() as s:
        assert [(c.name, c.state) for c in queries.checkpoint_rows(s)] == [("global_step_2", "ready")]
        assert queries.alternate_rows(s) == [] and queries.ignored_rows(s) == []
        results = queries.result_rows(s)
    source = case.source / case.candidate / "actor" / "huggingface"
    assert _stored(results, 2) == _evaluated(config, source)
    database.dispose()
