"""Issue 31: what is on disk under a run root can never end a scheduler pass or hide a checkpoint.

Each bad folder sits beside good checkpoints on a real tree, with a real database (SQLite and PostgreSQL)
and a controlled clock: the good ones must become ready, the bad one must be named once (a log line and a
row ``evald status`` lists), and the scan must go on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog

from daemon.config import RunConfig, SchedulingConfig, load_config
from daemon.errors import ConfigError
from daemon.scheduling.planner import Planner
from daemon.watching import Discovery, WatchedRun, candidate_dirs, filesystem, is_container, refusals
from daemon.watching.refusals import NAME_MAX
from inference.layouts import parse_step
from storage import queries
from storage.database import Database
from tests.checkpoints import copy_checkpoint, save_tiny_llama
from tests.conftest import TOY_SAVE_EVERY, ToyRun
from tests.harness import (
    Clock,
    evald,
    jobs,
    log_events,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)
from tests.writers.launch import deepspeed_run


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("src") / "model")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 2-rank ZeRO-1 run: ``global_step1``, ``global_step2``, ``latest``."""
    return deepspeed_run(1, tmp_path_factory.mktemp("zero1") / "run")


def _discovery(db: Database, roots: dict[str, Path], clock: Clock) -> Discovery:
    scheduling = SchedulingConfig(quiet_secs=2.0, invalid_after_secs=30.0)
    runs = []
    for name, root in roots.items():
        with db.session() as s:
            run_id = queries.ensure_run(s, name, str(root))
        runs.append(WatchedRun(RunConfig(name=name, root=root), run_id, ("arith",)))
    return Discovery(db, runs, scheduling, clock=clock, after_ready=Planner(scheduling, db, runs).plan)


def _settle(discovery: Discovery, clock: Clock, passes: int = 3) -> None:
    discovery.scan()
    for _ in range(passes):
        clock.now += 2.5
        discovery.tick()
        discovery.scan()


def _checkpoints(db: Database) -> dict[str, tuple[int | None, str, str]]:
    with db.session() as s:
        return {c.name: (c.step, c.state, c.reason or "") for c in queries.checkpoint_rows(s)}


def _ignored(db: Database) -> dict[str, str]:
    with db.session() as s:
        return {i.name: i.reason for i in queries.ignored_rows(s)}


def _lines(captured: list[MutableMapping[str, Any]]) -> list[tuple[str, str]]:
    return [
        (str(e["event"]), str(e.get("path", e.get("root", ""))))
        for e in captured
        if e["log_level"] in ("warning", "error")
    ]


def test_an_exception_judging_one_folder_is_that_folders_state(
    database: Database, source: Path, tmp_path: Path
) -> None:
    """A ``RecursionError`` from a deeply nested index (``'[' * 100000``) used to end every pass."""
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "step_5")
    deep = copy_checkpoint(source, root / "step_6")
    (deep / "model.safetensors.index.json").write_text("[" * 100_000)
    copy_checkpoint(source, root / "step_7")
    discovery = _discovery(database, {"r": root}, clock)
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    found = _checkpoints(database)
    assert {n: s for n, (_, s, _) in found.items()} == {
        "step_5": "ready",
        "step_6": "invalid",
        "step_7": "ready",
    }
    assert "step_6" in found["step_6"][2] or "index" in found["step_6"][2], found["step_6"]
    assert _lines(captured) == [("checkpoint.invalid", str(deep))]


def test_a_root_level_symlink_loop_is_named(database: Database, source: Path, tmp_path: Path) -> None:
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "step_5")
    (root / "step_250").symlink_to("step_251")  # step_250 -> step_251 -> step_250
    (root / "step_251").symlink_to("step_250")
    discovery = _discovery(database, {"r": root}, clock)
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    found = _checkpoints(database)
    assert found["step_5"][1] == "ready"
    for name in ("step_250", "step_251"):
        _, state, reason = found[name]
        assert (state, f"symlink loop at {name}") == ("invalid", reason[: len(f"symlink loop at {name}")])
    assert sorted(_lines(captured)) == [
        ("checkpoint.invalid", str(root / "step_250")),
        ("checkpoint.invalid", str(root / "step_251")),
    ]


def test_names_with_control_characters_or_not_utf8_never_take_a_step(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root, clock = tmp_path / "run", Clock()
    bad = ["step_340\n", "step_\n340", os.fsdecode(b"step_341\xff")]
    for name in bad:
        copy_checkpoint(source, root / name)
    copy_checkpoint(source, root / "step_340")
    discovery = _discovery(database, {"r": root}, clock)
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    assert {n: (st, s) for n, (st, s, _) in _checkpoints(database).items()} == {"step_340": (340, "ready")}
    with database.session() as s:
        assert [(j.step, j.checkpoint) for j in queries.job_rows(s)] == [(340, "step_340")]
    ignored = _ignored(database)
    assert set(ignored) == {"step_340\\n", "step_\\n340", "step_341\\xff"}
    for name, reason in ignored.items():
        assert reason.startswith(f"folder name '{name}' holds a control character"), reason
    assert sorted(_lines(captured)) == sorted(("folder.ignored", str(root / name)) for name in bad)
    # Renamed: taken as a checkpoint, and the note about the old name goes.
    (root / "step_\n340").rename(root / "step_342")
    _settle(discovery, clock)
    assert _checkpoints(database)["step_342"][:2] == (342, "ready")
    assert "step_\\n340" not in _ignored(database)


def test_a_long_name_or_a_file_named_like_a_checkpoint_is_named_not_taken(
    database: Database, source: Path, tmp_path: Path
) -> None:
    """``step_3017`` followed by 240 more characters was taken as step 3017; a plain file ``step_3021`` in the
    root got no line anywhere."""
    root, clock = tmp_path / "run", Clock()
    long_name = "step_3017" + "x" * 240
    copy_checkpoint(source, root / long_name)
    copy_checkpoint(source, root / ("step_3018" + "x" * (NAME_MAX - len("step_3018"))))  # as long as read
    (root / "step_3021").write_bytes(b"PK\x03\x04")
    (root / "checkpoint-3022.tar").write_bytes(b"")
    (root / "latest").write_text("step_3018")  # a tracker file: not a stray
    discovery = _discovery(database, {"r": root}, clock)
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    assert {n: (st, s) for n, (st, s, _) in _checkpoints(database).items()} == {
        "step_3018" + "x" * (NAME_MAX - len("step_3018")): (3018, "ready")
    }
    ignored = _ignored(database)
    assert set(ignored) == {long_name, "step_3021", "checkpoint-3022.tar"}
    assert ignored[long_name].startswith(f"folder name '{long_name[:40]}...' is 249 characters long")
    assert "a file named like a checkpoint (step 3021)" in ignored["step_3021"]
    assert "(step 3022)" in ignored["checkpoint-3022.tar"]
    expected = [("folder.ignored", str(root / n)) for n in (long_name, "step_3021", "checkpoint-3022.tar")]
    assert sorted(_lines(captured)) == sorted(expected)  # once each, over four passes
    # Gone, the note goes.
    (root / "step_3021").unlink()
    _settle(discovery, clock)
    assert set(_ignored(database)) == {long_name, "checkpoint-3022.tar"}


def _deepspeed_save_dir(engine: Path, save_dir: Path, tags: dict[str, str], latest: str) -> None:
    save_dir.mkdir(parents=True, exist_ok=True)
    for tag, real in tags.items():
        shutil.copytree(engine / real, save_dir / tag)
    shutil.copy(engine / "zero_to_fp32.py", save_dir / "zero_to_fp32.py")
    (save_dir / "latest").write_text(latest)


@pytest.mark.parametrize("save_dir", ["ds2", "qwen2-7b-grpo", "Qwen2.5-7B-Instruct"])
def test_a_save_dir_with_digits_in_its_name_is_a_container(
    database: Database, engine: Path, source: Path, tmp_path: Path, save_dir: str
) -> None:
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "step_5")
    _deepspeed_save_dir(
        engine, root / save_dir, {"global_step200": "global_step1", "300": "global_step2"}, "300"
    )
    assert parse_step(save_dir) == (None, None) and is_container(root / save_dir)
    discovery = _discovery(database, {"r": root}, clock)
    _settle(discovery, clock)
    assert {n: (st, s) for n, (st, s, _) in _checkpoints(database).items()} == {
        "step_5": (5, "ready"),
        f"{save_dir}/global_step200": (200, "ready"),
        f"{save_dir}/300": (300, "ready"),
    }


def test_a_save_dir_made_empty_before_its_first_save_is_never_a_checkpoint(
    database: Database, engine: Path, source: Path, tmp_path: Path
) -> None:
    """It used to stay a candidate and be scored later with whatever ``latest`` named then."""
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "step_5")
    (root / "ds").mkdir()
    discovery = _discovery(database, {"r": root}, clock)
    _settle(discovery, clock)
    _deepspeed_save_dir(engine, root / "ds", {"global_step30": "global_step1"}, "global_step30")
    discovery.hint("r", root / "ds")
    _settle(discovery, clock)
    _deepspeed_save_dir(engine, root / "ds", {"global_step31": "global_step2"}, "global_step31")
    _settle(discovery, clock)
    assert {n: (st, s) for n, (st, s, _) in _checkpoints(database).items()} == {
        "step_5": (5, "ready"),
        "ds/global_step30": (30, "ready"),
        "ds/global_step31": (31, "ready"),
    }
    assert _ignored(database) == {}


def test_a_save_dir_with_the_models_config_beside_latest_is_a_container(
    database: Database, engine: Path, source: Path, tmp_path: Path
) -> None:
    """``root/ds2/{config.json, global_step100, global_step200, latest}``: it was read as the one tag
    ``latest`` named when first seen, and neither global_step100 nor a later global_step300 was evaluated,
    without a word."""
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "step_5")
    save_dir = root / "ds2"
    tags = {"global_step100": "global_step1", "global_step200": "global_step2"}
    _deepspeed_save_dir(engine, save_dir, tags, "global_step200")
    shutil.copy(source / "config.json", save_dir / "config.json")  # model.config.save_pretrained(save_dir)
    assert is_container(save_dir)
    discovery = _discovery(database, {"r": root}, clock)
    _settle(discovery, clock)
    _deepspeed_save_dir(engine, save_dir, {"global_step300": "global_step1"}, "global_step300")
    discovery.hint("r", save_dir)
    _settle(discovery, clock)
    assert {n: (st, s) for n, (st, s, _) in _checkpoints(database).items()} == {
        "step_5": (5, "ready"),
        "ds2/global_step100": (100, "ready"),
        "ds2/global_step200": (200, "ready"),
        "ds2/global_step300": (300, "ready"),
    }
    # Weights of its own beside ``latest`` still make it a model folder, read as the tag it names.
    (save_dir / "model.safetensors").write_bytes(b"")
    assert not is_container(save_dir)


@pytest.mark.parametrize("with_state", [True, False])
def test_a_model_saved_into_the_root_is_named_with_how_to_evaluate_it(
    database: Database, source: Path, tmp_path: Path, with_state: bool
) -> None:
    """``trainer.save_model(output_dir)`` at the end of a TRL/HF run, beside ``checkpoint-N`` folders."""
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "checkpoint-20")
    (root / "checkpoint-20" / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, root / name)
    if with_state:
        (root / "trainer_state.json").write_text(json.dumps({"global_step": 40}))
    discovery = _discovery(database, {"r": root}, clock)
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    assert {n: (st, s) for n, (st, s, _) in _checkpoints(database).items()} == {
        "checkpoint-20": (20, "ready")
    }
    reason = _ignored(database)["(run root)"]
    assert "the run root itself holds a model" in reason and "evald eval <root>" in reason
    assert ("global_step 40" in reason) is with_state
    assert _lines(captured) == [("folder.ignored", str(root))]


def test_weights_overwritten_after_evaluation_are_said_once(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "step_5")
    copy_checkpoint(source, root / "step_6")
    discovery = _discovery(database, {"r": root}, clock)
    _settle(discovery, clock)
    weights = root / "step_5" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 16)
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    [line] = [e for e in captured if e["log_level"] == "warning"]
    assert (line["event"], line["checkpoint"], line["step"]) == ("checkpoint.overwritten", "step_5", 5)
    assert "step_5 (step 5) was overwritten in place" in _ignored(database)["step_5"]
    assert {n: s for n, (_, s, _) in _checkpoints(database).items()} == {"step_5": "ready", "step_6": "ready"}
    # Rotated away: the note goes with it.
    shutil.rmtree(root / "step_5")
    _settle(discovery, clock)
    assert _ignored(database) == {}


def test_megatron_and_nemo_rl_folders_say_how_to_export(
    database: Database, source: Path, tmp_path: Path
) -> None:
    root, clock = tmp_path / "run", Clock()
    copy_checkpoint(source, root / "step_5")
    (root / "iter_0000100" / "mp_rank_00").mkdir(parents=True)
    (root / "iter_0000100" / "mp_rank_00" / "model_optim_rng.pt").write_bytes(b"PK")
    (root / "latest_checkpointed_iteration.txt").write_text("100")
    (root / "step_7" / "policy" / "weights").mkdir(parents=True)
    (root / "step_7" / "policy" / "weights" / "__0_0.distcp").write_bytes(b"x")
    (root / "step_7" / "policy" / "weights" / ".metadata").write_bytes(b"x")
    discovery = _discovery(database, {"r": root}, clock)
    _settle(discovery, clock)  # well before invalid_after_secs: the shape is known at once
    ignored = _ignored(database)
    assert "Megatron-LM checkpoint" in ignored["iter_0000100"]
    assert "tools/checkpoint/convert.py --saver hf" in ignored["iter_0000100"]
    assert "NeMo-RL checkpoint" in ignored["step_7"] and "convert_dcp_to_hf.py" in ignored["step_7"]
    assert {n: s for n, (_, s, _) in _checkpoints(database).items()} == {"step_5": "ready"}


def test_a_run_root_that_becomes_a_symlink_loop_holds_only_that_run(
    database: Database, source: Path, tmp_path: Path
) -> None:
    good, looped, clock = tmp_path / "good", tmp_path / "looped", Clock()
    copy_checkpoint(source, good / "step_5")
    looped.mkdir()
    discovery = _discovery(database, {"good": good, "looped": looped}, clock)
    looped.rmdir()
    looped.symlink_to("looped")  # ln -s looped looped, made while the daemon runs
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    assert {n: (st, s) for n, (st, s, _) in _checkpoints(database).items()} == {"step_5": (5, "ready")}
    [line] = [e for e in captured if e["log_level"] == "error"]
    assert (line["event"], line["run"]) == ("run.root_unreadable", "looped")
    assert "is a symlink loop" in line["error"]
    assert filesystem.is_network(looped) is False  # used to raise RuntimeError (Path.resolve)
    assert candidate_dirs(good) == [good / "step_5"]


@pytest.mark.parametrize("root", ["loop", "loop/sub"])
def test_config_check_refuses_a_root_that_is_a_symlink_loop(tmp_path: Path, root: str) -> None:
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "d.jsonl").write_text("")
    text = f"""
[database]
url = "sqlite:///x.db"
[[runs]]
name = "fresh"
root = "not-yet"
[[runs]]
name = "looped"
root = "{root}"
[[tasks]]
name = "t"
dataset = "d.jsonl"
"""
    (tmp_path / "evald.toml").write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "evald.toml")
    assert caught.value.problems == [
        f"runs[1]: run 'looped': root {tmp_path / root} is a symlink loop (Too many levels of symbolic "
        "links); fix the link or the path"
    ]


def test_shown_names() -> None:
    assert refusals.shown("step_340\n") == "step_340\\n"
    assert refusals.shown(os.fsdecode(b"step_7\xff")) == "step_7\\xff"
    assert refusals.shown("schritt_ä 1") == "schritt_ä 1"
    assert refusals.name_problem("step_340") is None


@pytest.mark.slow
def test_a_daemon_whose_run_root_becomes_a_loop_watches_the_others_and_refuses_the_reload(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    database = upgraded(database_url)
    other = tmp_path / "other"
    other.mkdir()
    config = write_config(
        tmp_path,
        database_url,
        dataset=write_dataset(tmp_path / "arith.jsonl", 4),
        run_extra=f'\n[[runs]]\nname = "other"\nroot = "{other}"\n',
    )
    root = tmp_path / "run"
    first, second = TOY_SAVE_EVERY, 2 * TOY_SAVE_EVERY
    copy_checkpoint(toy_run.path / f"step_{first}", root / f"step_{first}")
    log = tmp_path / "daemon.log"
    with running_daemon(config, log) as daemon:
        other.rmdir()
        other.symlink_to("other")  # ln -s other other, while it runs
        copy_checkpoint(toy_run.last_checkpoint, root / f"step_{second}")
        wait_for(
            lambda: {j.step for j in jobs(database) if j.state == "succeeded"} >= {first, second} or None,
            120,
            "both steps evaluated",
            daemon.process,
        )
        daemon.process.send_signal(signal.SIGHUP)
        [refused] = wait_for(
            lambda: log_events(log, "config.reload_refused") or None, 30, "reload refused", daemon.process
        )
        assert refused["problems"] == [
            f"{config}: runs[1]: run 'other': root {other} is a symlink loop (Too many levels of symbolic "
            "links); fix the link or the path"
        ]
        # Said at the first pass over the roots after the loop was made: waited for, as the evaluations
        # may end before it.
        [unreadable] = wait_for(
            lambda: log_events(log, "run.root_unreadable") or None, 30, "the loop said", daemon.process
        )
        assert unreadable["run"] == "other" and "is a symlink loop" in unreadable["error"]
        assert daemon.stop() == 0
    assert not log_events(log, "daemon.pass_failed") and not log_events(log, "scheduler.pass_failed")
    checked = evald("config", "check", str(config))
    assert checked.returncode != 0 and f"run 'other': root {other} is a symlink loop" in checked.stderr
    database.dispose()


def test_a_write_that_stalls_past_the_quiet_period_and_goes_on_is_judged_again(
    database: Database, source: Path, tmp_path: Path
) -> None:
    """A weights file short of its header is named invalid once the folder is quiet (not after
    invalid_after_secs); a trainer's write that stalled that long on a slow filesystem and then went on
    must not leave the checkpoint invalid for good: its folder changed, so it is judged again."""
    root, clock = tmp_path / "run", Clock()
    folder = copy_checkpoint(source, root / "step_7")
    weights = (source / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    discovery = _discovery(database, {"r": root}, clock)
    with structlog.testing.capture_logs() as captured:
        _settle(discovery, clock)
    assert _checkpoints(database)["step_7"][1] == "invalid", _checkpoints(database)["step_7"]
    with database.session() as s:
        assert queries.job_rows(s) == []
    (folder / "model.safetensors").write_bytes(weights)  # the write goes on and ends
    with structlog.testing.capture_logs() as again:
        _settle(discovery, clock)
    assert _checkpoints(database)["step_7"][:2] == (7, "ready")
    with database.session() as s:
        assert [j.checkpoint for j in queries.job_rows(s)] == ["step_7"]
    assert [e["event"] for e in again if e["event"].startswith("checkpoint.")][:1] == ["checkpoint.reopened"]
    # An invalid folder that does not change stays as it was named, said once.
    _settle(discovery, clock)
    assert [e["event"] for e in captured].count("checkpoint.invalid") == 1
    # A restarted daemon takes the listing of what it finds invalid at its first rescan, then the same.
    (folder / "model.safetensors").write_bytes(b"")
    copy_checkpoint(source, root / "step_8", lambda f: (f / "model.safetensors").unlink())
    (root / "step_8" / "model.safetensors").write_bytes(b"")
    restarted = _discovery(database, {"r": root}, clock)
    _settle(restarted, clock)
    assert _checkpoints(database)["step_8"][1] == "invalid"
    shutil.copy(source / "model.safetensors", root / "step_8" / "model.safetensors")
    fresh = _discovery(database, {"r": root}, clock)
    _settle(fresh, clock)  # its first rescan: the listing as it is now is the one compared later
    assert _checkpoints(database)["step_8"][1] == "invalid"
    (root / "step_8" / "model.safetensors").touch()
    _settle(fresh, clock)
    assert _checkpoints(database)["step_8"][:2] == (8, "ready")
