"""Readiness of the save_pretrained layout on real files, and the quiet-period / marker decision."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.watching.readiness import Decision, decide
from inference.layouts import (
    STEP_MAX,
    Readiness,
    Verdict,
    detect,
    inspect,
    parse_step,
    step_problem,
    take_snapshot,
)
from inference.layouts.hf import INDEX_FILE
from tests.checkpoints import replay, save_tiny_llama


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("single") / "step_10")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = save_tiny_llama(tmp_path_factory.mktemp("sharded") / "step_20", shard_size="8KB")
    assert (directory / INDEX_FILE).exists()
    return directory


def _verdict(directory: Path) -> Verdict:
    snapshot = take_snapshot(directory)
    layout = detect(directory, snapshot, "auto")
    assert layout == "hf"
    return inspect(directory, snapshot, layout)


def test_complete_checkpoints(single: Path, sharded: Path) -> None:
    assert _verdict(single).readiness is Readiness.COMPLETE
    assert _verdict(sharded).readiness is Readiness.COMPLETE


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_no_intermediate_state_of_a_slow_write_is_complete_or_refused_while_it_changes(
    layout: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source: Path = request.getfixturevalue(layout)
    target = tmp_path / source.name
    states = []
    for step in replay(source, target, chunks=4):
        snapshot = take_snapshot(target)
        kind = detect(target, snapshot, "auto")
        verdict = None if kind is None else inspect(target, snapshot, kind)
        states.append((step, None if verdict is None else verdict.readiness))
        # A file still being written may look cut short, never broken for good: the folder waits while
        # it changes (quiet_for 0), whatever the verdict says.
        assert verdict is None or not verdict.final, (step, verdict)
        if verdict is not None:
            assert _decide(verdict, 0.0) is not Decision.INVALID, (step, verdict)
    *partial, last = states
    assert last[1] is Readiness.COMPLETE
    early = [step for step, readiness in partial if readiness is Readiness.COMPLETE]
    # Only files after the weights (none for save_pretrained's model files) may be unfinished at COMPLETE.
    assert early == [], early


def test_a_truncated_shard_is_named_once_quiet_not_after_invalid_after_secs(
    single: Path, tmp_path: Path
) -> None:
    target = tmp_path / "step_10"
    target.mkdir()
    (target / "config.json").write_bytes((single / "config.json").read_bytes())
    data = (single / "model.safetensors").read_bytes()
    (target / "model.safetensors").write_bytes(data[: len(data) - 100])
    verdict = _verdict(target)
    assert verdict == Verdict(
        Readiness.INVALID, f"model.safetensors: truncated ({len(data) - 100} of {len(data)} bytes)"
    )
    # Still changing: it may be a write in progress. Quiet for the quiet period (5 s): named, not held
    # until invalid_after_secs (60 s here).
    assert _decide(verdict, 4.9) is Decision.WAIT
    assert _decide(verdict, 5.0) is Decision.INVALID


def test_index_naming_a_missing_shard(sharded: Path, tmp_path: Path) -> None:
    target = tmp_path / "step_20"
    target.mkdir()
    for path in sharded.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    shard = sorted(json.loads((sharded / INDEX_FILE).read_text())["weight_map"].values())[-1]
    (target / shard).unlink()
    verdict = _verdict(target)
    assert verdict.readiness is Readiness.INCOMPLETE
    assert verdict.reason == f"shard {shard} named in {INDEX_FILE} is missing"


def test_corrupt_header_and_bad_config_are_invalid(single: Path, tmp_path: Path) -> None:
    target = tmp_path / "step_10"
    target.mkdir()
    (target / "config.json").write_text("{not json")
    (target / "model.safetensors").write_bytes((single / "model.safetensors").read_bytes())
    verdict = _verdict(target)
    assert verdict.readiness is Readiness.INVALID and verdict.reason.startswith(
        "config.json is not valid JSON"
    )
    (target / "config.json").write_bytes((single / "config.json").read_bytes())
    (target / "model.safetensors").write_bytes(b"\xff" * 64)
    verdict = _verdict(target)
    assert verdict.readiness is Readiness.INVALID and "not a safetensors header" in verdict.reason


def _decide(verdict: Verdict, quiet_for: float, marker: str | None = None, present: bool = False) -> Decision:
    outcome = decide(
        verdict,
        quiet_for=quiet_for,
        quiet_secs=5.0,
        invalid_after_secs=60.0,
        marker=marker,
        marker_present=present,
    )
    return outcome.decision


def test_decide_needs_a_quiet_period_or_the_marker() -> None:
    complete, incomplete = Verdict.complete(), Verdict(Readiness.INCOMPLETE, "shard missing")
    assert _decide(complete, 4.9) is Decision.WAIT
    assert _decide(complete, 5.0) is Decision.READY
    assert _decide(incomplete, 59) is Decision.WAIT
    late = decide(
        incomplete, quiet_for=61, quiet_secs=5, invalid_after_secs=60, marker=None, marker_present=False
    )
    assert late.decision is Decision.INVALID
    assert late.reason == "still incomplete after 61 s unchanged: shard missing"
    assert _decide(complete, 0, marker="COMPLETE", present=False) is Decision.WAIT
    assert _decide(complete, 0, marker="COMPLETE", present=True) is Decision.READY
    assert _decide(incomplete, 0, marker="COMPLETE", present=True) is Decision.INVALID


def test_a_final_refusal_needs_no_quiet_period(single: Path, tmp_path: Path) -> None:
    """A FIFO where the weights should be is refused at its first look (one line, no "discovered" before
    it); a corrupt header still waits for the quiet period, as a half-written file looks corrupt."""
    import os
    import shutil

    folder = tmp_path / "step_10"
    shutil.copytree(single, folder)
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    verdict = inspect(folder, take_snapshot(folder), "hf")
    assert verdict.final and "FIFO" in verdict.reason
    timing = {"quiet_secs": 2.0, "invalid_after_secs": 300.0, "marker": None, "marker_present": False}
    assert decide(verdict, quiet_for=0.0, **timing).decision is Decision.INVALID  # type: ignore[arg-type]
    corrupt = Verdict(Readiness.INVALID, "corrupt header")
    assert decide(corrupt, quiet_for=0.0, **timing).decision is Decision.WAIT  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("checkpoint-500", (500, None)),
        ("global_step120", (120, None)),
        ("global_step_7", (7, None)),
        ("step_40", (40, None)),
        ("epoch2epochstep15globalstep315", (315, 2)),
        ("final", (None, None)),
        ("run3-ckpt-0090", (90, None)),
        # A minus sign after a separator is a sign (then refused), after a word it is a separator.
        ("step_-1", (-1, None)),
        ("global_step_-20", (-20, None)),
        ("checkpoint--3", (-3, None)),
        ("step-4", (4, None)),
        ("model-5", (5, None)),
        ("run_-6", (-6, None)),
        ("epoch-1epochstep2globalstep3", (3, -1)),
        ("step_2147483648", (2**31, None)),
        ("step_99999999999999999999", (99999999999999999999, None)),
    ],
)
def test_step_from_directory_name(name: str, expected: tuple[int | None, int | None]) -> None:
    assert parse_step(name) == expected


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("step_0", None),
        ("final", None),
        (f"step_{STEP_MAX}", None),
        (
            "step_2147483648",
            "step 2147483648 in folder name 'step_2147483648' is out of range (0..2147483647)",
        ),
        (
            "step_99999999999999999999",
            "step 99999999999999999999 in folder name 'step_99999999999999999999' is out of range "
            "(0..2147483647)",
        ),
        ("step_-1", "step -1 in folder name 'step_-1' is out of range (0..2147483647)"),
        (
            "epoch2147483648epochstep1globalstep5",
            "epoch 2147483648 in folder name 'epoch2147483648epochstep1globalstep5' is out of range "
            "(0..2147483647)",
        ),
    ],
)
def test_steps_a_database_column_cannot_hold_are_refused(name: str, problem: str | None) -> None:
    """The same range on both backends: PostgreSQL's INTEGER; SQLite would take up to 2**63 - 1."""
    step, epoch = parse_step(name)
    assert step_problem(name, step, epoch) == problem
