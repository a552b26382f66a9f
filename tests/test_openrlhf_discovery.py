"""OpenRLHF's default checkpoints under a watched root (issue 23), written by the real DeepSpeed engine
(ZeRO-3, two ranks, ``tests/writers/deepspeed_engine.py --openrlhf``): ``_actor/`` holds the tags,
``latest`` and DeepSpeed's ``zero_to_fp32.py`` / ``zero_to_torch.py``, which used to make discovery pass
``_actor/`` over without a word. Nothing is skipped silently: a folder not taken is logged once, with why.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import structlog

from daemon.analysis import report
from daemon.config import RunConfig, SchedulingConfig
from daemon.scheduling.planner import Planner
from daemon.watching import Discovery, WatchedRun, alternates, candidate_dirs, is_container, refusals
from inference import layouts
from inference.layouts import LayoutSettings, Readiness, Shape, take_snapshot
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from tests.harness import Clock
from tests.layout_checks import consolidated_logits
from tests.writers.launch import deepspeed_run

pytestmark = pytest.mark.slow

ACTOR_TAGS = ("_actor/global_step1", "_actor/global_step2")
HF_FOLDERS = ("global_step1_hf", "global_step2_hf")


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The writer's output, as OpenRLHF with ``--save_hf_ckpt`` leaves it (and its ``_reference``)."""
    return deepspeed_run(3, tmp_path_factory.mktemp("openrlhf") / "ckpt")


def _clutter(root: Path) -> None:
    """What real tools leave beside checkpoints: none of it may hide one."""
    (root / "README.md").write_text("# model card\n")
    (root / ".nfs000000000123").write_bytes(b"")
    (root / "events.tmp").write_bytes(b"")
    (root / "trainer_state.json").write_text("{}")
    (root / "rng_state_0.pth").write_bytes(b"")
    (root / ".metadata").write_bytes(b"")
    (root / "_actor" / "README.md").write_text("engine checkpoints\n")
    (root / "_actor" / ".nfs000000000456").write_bytes(b"")
    wandb = root / "wandb"
    (wandb / "run-20261201_120000-ab12cd34" / "files").mkdir(parents=True)
    (wandb / "run-20261201_120000-ab12cd34" / "files" / "config.yaml").write_text("a: 1\n")
    (wandb / "debug.log").write_text("")
    (root / "tmp-checkpoint-3").mkdir()  # an HF Trainer save in progress


def test_the_actor_folder_with_deepspeeds_scripts_is_looked_into(written: Path) -> None:
    assert (written / "_actor" / "zero_to_fp32.py").is_file()
    assert is_container(written / "_actor")
    assert not is_container(written / "global_step1_hf")
    found = [p.relative_to(written).as_posix() for p in candidate_dirs(written)]
    assert found == [*ACTOR_TAGS, *HF_FOLDERS]


def _discovery(database: Database, root: Path, written: Path, **run: object) -> tuple[Discovery, Clock]:
    with database.session() as s:
        run_id = queries.ensure_run(s, "r", str(root))
    hf_config = written.with_name("ckpt_reference") / "hf_config"
    watched = WatchedRun(RunConfig(name="r", root=root, hf_config=hf_config, **run), run_id, ("arith",))
    scheduling = SchedulingConfig(quiet_secs=1.0, invalid_after_secs=10.0)
    clock = Clock()
    planner = Planner(scheduling, database, [watched])
    return Discovery(database, [watched], scheduling, clock=clock, after_ready=planner.plan), clock


def _passes(discovery: Discovery, clock: Clock, n: int = 3) -> None:
    discovery.scan()
    for _ in range(n):
        clock.now += 6.0
        discovery.tick()
        discovery.scan()


def _checkpoints(database: Database) -> dict[str, tuple[int | None, str]]:
    with database.session() as s:
        return {c.name: (c.step, c.state) for c in queries.checkpoint_rows(s)}


def _alternates(database: Database) -> dict[str, str]:
    with database.session() as s:
        return {a.name: a.of for a in queries.alternate_rows(s)}


def _jobs(database: Database) -> list[tuple[str, int | None]]:
    with database.session() as s:
        return sorted((j.checkpoint, j.step) for j in queries.job_rows(s))


def test_every_checkpoint_is_found_beside_what_tools_leave_and_what_is_not_taken_is_said_once(
    database: Database, written: Path, tmp_path: Path
) -> None:
    """Each step once, in its HF export (the default preference); the engine tags are its alternates."""
    root = tmp_path / "ckpt"
    shutil.copytree(written, root)
    _clutter(root)
    discovery, clock = _discovery(database, root, written)
    with structlog.testing.capture_logs() as captured:
        _passes(discovery, clock)
    assert _checkpoints(database) == {"global_step1_hf": (1, "ready"), "global_step2_hf": (2, "ready")}
    assert _alternates(database) == {
        "_actor/global_step1": "global_step1_hf",
        "_actor/global_step2": "global_step2_hf",
    }
    assert _jobs(database) == [("global_step1_hf", 1), ("global_step2_hf", 2)]
    ignored = [
        (Path(str(e["path"])).relative_to(root).as_posix(), e)
        for e in captured
        if e["event"] == "folder.ignored"
    ]
    # The trainer's wandb/ folder is a known tracker folder: skipped quietly, not "ignored".
    assert [name for name, _ in ignored] == ["tmp-checkpoint-3"]
    assert ignored[0][1]["reason"] == refusals.IGNORED_NAME
    assert not [
        e for e in captured if e["log_level"] in ("warning", "error") and e["event"] != "folder.ignored"
    ]
    # evald status names them per run (the rendering cmd_status prints).
    with database.session() as s:
        summary = report.status(
            queries.checkpoint_rows(s),
            queries.job_rows(s),
            ["r"],
            ignored=queries.ignored_rows(s),
            alternates=queries.alternate_rows(s),
        )
    assert [i["folder"] for i in summary["r"]["ignored"]] == ["tmp-checkpoint-3"]
    text = report.status_text(summary).splitlines()
    assert f"  ignored:     tmp-checkpoint-3: {refusals.IGNORED_NAME}" in text
    assert (
        "  alternate:   _actor/global_step2 (openrlhf): the same step as global_step2_hf, which is "
        "evaluated instead"
    ) in text

    # A restart finds everything recorded: nothing new, nothing said again.
    again, clock = _discovery(database, root, written)
    with structlog.testing.capture_logs() as captured:
        _passes(again, clock)
    assert not [
        e for e in captured if e["event"] in ("folder.ignored", "checkpoint.alternate", "checkpoint.ready")
    ]
    assert _jobs(database) == [("global_step1_hf", 1), ("global_step2_hf", 2)]
    # The tmp folder renamed into place: no longer ignored.
    (root / "tmp-checkpoint-3").rmdir()
    again.scan()
    with database.session() as s:
        assert [r.name for r in queries.ignored_rows(s)] == []


def test_the_preference_is_per_run_and_a_late_preferred_shape_is_not_evaluated_again(
    database: Database, written: Path, tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    (root / "_actor").mkdir(parents=True)
    for name in ("global_step1", "zero_to_fp32.py", "zero_to_torch.py", "latest"):
        source = written / "_actor" / name
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, root / "_actor" / name)
    shutil.copytree(written / "global_step2_hf", root / "global_step2_hf")
    shutil.copytree(written / "_actor" / "global_step2", root / "_actor" / "global_step2")
    discovery, clock = _discovery(database, root, written, prefer=("resumable", "hf_export"))
    _passes(discovery, clock)
    # step 1: the engine tag alone, evaluated; step 2: both there, the resumable one preferred here.
    assert _checkpoints(database) == {
        "_actor/global_step1": (1, "ready"),
        "_actor/global_step2": (2, "ready"),
    }
    assert _alternates(database) == {"global_step2_hf": "_actor/global_step2"}
    # OpenRLHF writes global_step1_hf after step 1's engine tag was already taken: not evaluated again.
    shutil.copytree(written / "global_step1_hf", root / "global_step1_hf")
    _passes(discovery, clock)
    assert _alternates(database) == {
        "global_step1_hf": "_actor/global_step1",
        "global_step2_hf": "_actor/global_step2",
    }
    assert _jobs(database) == [("_actor/global_step1", 1), ("_actor/global_step2", 2)]


def test_a_deepspeed_save_dir_is_read_as_the_tag_latest_names(written: Path, tmp_path: Path) -> None:
    """``evald eval CKPT/_actor``: the save_dir is evaluated as ``latest``'s tag (it said "no weights")."""
    save_dir = written / "_actor"
    snapshot = take_snapshot(save_dir)
    assert layouts.detect(save_dir, snapshot, "auto") == "deepspeed"
    layout = layouts.get("deepspeed")
    verdict = layout.inspect(save_dir, snapshot, LayoutSettings())
    assert (verdict.readiness, verdict.reason) == (Readiness.COMPLETE, "latest names global_step2: complete")
    assert layout.step(save_dir) == (2, None)
    folder = layout.materialise(save_dir, LayoutSettings(), tmp_path / "scratch")
    tag = layouts.get("openrlhf").materialise(save_dir / "global_step2", LayoutSettings(), tmp_path / "tag")
    assert consolidated_logits(folder).equal(consolidated_logits(tag))


def _other(state: str, shape: str) -> alternates.Other:
    return alternates.Other(7, "other", CheckpointState(state), Shape(shape))


@pytest.mark.parametrize(
    ("mine", "others", "preference", "expected"),
    [
        ("resumable", [], ("hf_export", "resumable"), alternates.Choice.CHECKPOINT),
        # Already taken: an alternate, whatever the preference (its result would repeat the other's).
        ("hf_export", [("ready", "resumable")], ("hf_export", "resumable"), alternates.Choice.ALTERNATE),
        ("resumable", [("ready", "hf_export")], ("hf_export", "resumable"), alternates.Choice.ALTERNATE),
        # The preferred shape is still being written: wait for it.
        ("resumable", [("discovered", "hf_export")], ("hf_export", "resumable"), alternates.Choice.WAIT),
        (
            "hf_export",
            [("discovered", "resumable")],
            ("hf_export", "resumable"),
            alternates.Choice.CHECKPOINT,
        ),
        ("hf_export", [("discovered", "resumable")], ("resumable", "hf_export"), alternates.Choice.WAIT),
        (
            "resumable",
            [("discovered", "resumable")],
            ("hf_export", "resumable"),
            alternates.Choice.CHECKPOINT,
        ),
        # A shape the preference leaves out comes after every listed one.
        ("hf_export", [("discovered", "resumable")], ("resumable",), alternates.Choice.WAIT),
    ],
)
def test_which_shape_of_a_step_is_evaluated(
    mine: str, others: list[tuple[str, str]], preference: tuple[str, ...], expected: alternates.Choice
) -> None:
    decision = alternates.choose(
        Shape(mine), [_other(*o) for o in others], tuple(Shape(p) for p in preference)
    )
    assert decision.choice is expected


def test_two_shapes_ready_at_their_first_look_are_one_checkpoint_in_the_preferred_shape(
    database: Database, written: Path, tmp_path: Path
) -> None:
    """With a marker there is no quiet period: both shapes of a step present at the first (start-up) scan
    are ready at once. The scan meets ``_actor/global_stepN`` first; the step is still evaluated once, in
    the preferred shape (it was taken as found, before the other shape was looked at)."""
    root = tmp_path / "ckpt"
    shutil.copytree(written, root)
    for name in (*ACTOR_TAGS, *HF_FOLDERS):
        (root / name / "COMPLETE").touch()
    discovery, clock = _discovery(database, root, written, marker="COMPLETE")
    discovery.scan()  # one pass
    assert _checkpoints(database) == {"global_step1_hf": (1, "ready"), "global_step2_hf": (2, "ready")}
    assert _alternates(database) == {
        "_actor/global_step1": "global_step1_hf",
        "_actor/global_step2": "global_step2_hf",
    }
    assert _jobs(database) == [("global_step1_hf", 1), ("global_step2_hf", 2)]
    _passes(discovery, clock)
    assert _jobs(database) == [("global_step1_hf", 1), ("global_step2_hf", 2)]

    # Per run: preferring the resumable shape, the same single pass takes the engine tags.
    other = tmp_path / "other"
    shutil.copytree(root, other)
    with database.session() as s:
        run_id = queries.ensure_run(s, "o", str(other))
    config = RunConfig(
        name="o",
        root=other,
        hf_config=written.with_name("ckpt_reference") / "hf_config",
        marker="COMPLETE",
        prefer=("resumable", "hf_export"),
    )
    watched = WatchedRun(config, run_id, ("arith",))
    scheduling = SchedulingConfig(quiet_secs=1.0, invalid_after_secs=10.0)
    Discovery(database, [watched], scheduling, clock=Clock()).scan()
    with database.session() as s:
        taken = {c.name: c.state for c in queries.checkpoint_rows(s) if c.run == "o"}
        of = {a.name: a.of for a in queries.alternate_rows(s) if a.run == "o"}
    assert taken == {"_actor/global_step1": "ready", "_actor/global_step2": "ready"}
    assert of == {"global_step1_hf": "_actor/global_step1", "global_step2_hf": "_actor/global_step2"}


def test_a_ready_shape_waits_for_a_preferred_one_discovered_in_the_same_pass(
    database: Database, written: Path, tmp_path: Path
) -> None:
    """The engine tag has its marker, the HF export (preferred) is there without one yet: in the same
    pass the export is recorded as discovered, and the tag waits for it instead of being taken."""
    root = tmp_path / "ckpt"
    shutil.copytree(written, root)
    (root / "_actor" / "global_step1" / "COMPLETE").touch()
    discovery, _ = _discovery(database, root, written, marker="COMPLETE")
    with structlog.testing.capture_logs() as captured:
        discovery.scan()
    # The tag was ready at its first look, so it was never recorded as discovered: it waits in memory,
    # and says so.
    assert _checkpoints(database) == {
        "_actor/global_step2": (2, "discovered"),
        "global_step1_hf": (1, "discovered"),
        "global_step2_hf": (2, "discovered"),
    }
    assert [e["path"] for e in captured if e["event"] == "checkpoint.waiting"] == [
        str(root / "_actor" / "global_step1")
    ]
    assert _jobs(database) == []
    (root / "global_step1_hf" / "COMPLETE").touch()
    discovery.hint("r", root / "global_step1_hf")
    assert _alternates(database) == {"_actor/global_step1": "global_step1_hf"}
    assert _jobs(database) == [("global_step1_hf", 1)]
