"""The folders experiment trackers write beside the checkpoints (W&B's ``wandb/``, MLflow's ``mlruns/`` and
``mlflow.db``, TensorBoard's ``runs/``) are known: discovery passes over them without a word, written here
by the trackers' own libraries, while a folder it does not know is still named."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from daemon.config import RunConfig, SchedulingConfig
from daemon.scheduling.planner import Planner
from daemon.watching import Discovery, WatchedRun
from daemon.watching.folders import is_tracker_folder
from storage import queries
from storage.database import Database
from tests.checkpoints import copy_checkpoint, save_tiny_llama
from tests.deadlines import patient
from tests.forkserver import worker_python
from tests.harness import Clock

#: A trainer's tracker calls, as HF Trainer's callbacks make them, in a process of its own.
TRAINER = """
import sys
from pathlib import Path
root = Path(sys.argv[1])
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(log_dir=str(root / "runs" / "Dec04_10-00-00_node7"))
writer.add_scalar("train/loss", 1.0, 1)
writer.close()
if sys.argv[2] == "1":
    import wandb
    run = wandb.init(project="grpo", dir=str(root), mode="offline", settings=wandb.Settings(silent=True))
    run.log({"train/loss": 1.0})
    run.finish()
if sys.argv[3] == "1":
    # Forked by the session's worker server, which hides mlflow as evald's worker does
    # (inference.worker.skip_mlflow); a trainer has it.
    if "mlflow" in sys.modules and sys.modules["mlflow"] is None:
        del sys.modules["mlflow"]
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.create_experiment("grpo", artifact_location=(root / "mlruns").as_uri())
    run = client.create_run(experiment)
    client.log_metric(run.info.run_id, "train/loss", 1.0, step=1)
    client.log_text(run.info.run_id, "trainer", "notes.txt")
"""


#: Whether wandb and mlflow are installed (the trainer writes their folders only then).
HAS = [importlib.util.find_spec(m) is not None for m in ("wandb", "mlflow")]


@pytest.fixture(scope="module")
def trackers_wrote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the trackers wrote into a run's root, once for the module (their imports and W&B's service
    cost ~5 CPU-s a run; each backend's test copies it). A script run by the session's worker interpreter:
    forked by its fork server, torch is imported already (a fresh interpreter spent 7.3 CPU-s)."""
    root = tmp_path_factory.mktemp("trackers") / "run"
    root.mkdir()
    script = root.parent / "trainer.py"
    script.write_text(TRAINER, encoding="utf-8")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    subprocess.run(
        [worker_python(), str(script), str(root), *("1" if h else "0" for h in HAS)],
        check=True,
        env=env,
        timeout=patient(120),
        cwd=root.parent,
    )
    return root


def test_tracker_folders_are_passed_over_quietly(
    database: Database, trackers_wrote: Path, tmp_path: Path
) -> None:
    root = tmp_path / "run"
    source = save_tiny_llama(tmp_path / "src" / "model")
    copy_checkpoint(source, root / "step_5")
    has = HAS
    for written in trackers_wrote.iterdir():
        if written.is_dir():
            shutil.copytree(written, root / written.name, symlinks=True)
        else:
            shutil.copy2(written, root / written.name)
    # A folder evald knows nothing of, with a step in a sub-folder's name: still named, not skipped.
    (root / "logs" / "rank7").mkdir(parents=True)
    (root / "logs" / "rank7" / "out.txt").write_text("hello\n", encoding="utf-8")
    expected_skipped = ["runs"] + (["wandb"] if has[0] else []) + (["mlruns"] if has[1] else [])
    for name in expected_skipped:
        assert (root / name).is_dir() and is_tracker_folder(root / name), name
    assert not is_tracker_folder(root / "logs")

    clock = Clock()
    scheduling = SchedulingConfig(quiet_secs=2.0, invalid_after_secs=30.0)
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(root))
    runs = [WatchedRun(RunConfig(name="r", root=root), run_id, ("arith",))]
    discovery = Discovery(
        database, runs, scheduling, clock=clock, after_ready=Planner(scheduling, database, runs).plan
    )
    discovery.scan()
    for _ in range(4):
        clock.now += 10.0
        discovery.tick()
        discovery.scan()
    # Events under the trackers' folders (the trainer logging on) are no hint of a checkpoint either.
    for name in expected_skipped:
        discovery.hint("r", root / name)
    with database.session() as s:
        states = {c.name: c.state for c in queries.checkpoint_rows(s)}
        ignored = {i.name: i.reason for i in queries.ignored_rows(s)}
    assert states == {"step_5": "ready"}
    assert set(ignored) == {"logs/rank7"}, ignored
    assert "no checkpoint layout" in ignored["logs/rank7"]


@pytest.mark.parametrize("name", ["runs", "tensorboard", "tensorboard_log"])
def test_a_tensorboard_named_folder_holding_a_model_is_looked_at(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name / "checkpoint-5"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}", encoding="utf-8")
    assert not is_tracker_folder(tmp_path / name)
    (tmp_path / name / "events.out.tfevents.1.node7").write_bytes(b"")
    assert not is_tracker_folder(tmp_path / name)
    (folder / "config.json").unlink()
    assert is_tracker_folder(tmp_path / name)
