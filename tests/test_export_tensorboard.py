"""``evald export tensorboard``: event files written by the real SummaryWriter, read back with
TensorBoard's own EventAccumulator and compared with the database."""

from __future__ import annotations

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
    EventAccumulator,
)

from daemon.cli import main
from storage import queries
from tests import surface_data
from tests.harness import upgraded, write_config, write_dataset


def _read(folder: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    accumulator.Reload()
    return accumulator


def test_export_matches_the_database(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = upgraded(database_url)
    try:
        surface_data.store(database)
        with database.session() as session:
            stored = queries.result_rows(session, run="a")
    finally:
        database.dispose()
    config = str(write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "d.jsonl", 2)))
    out = tmp_path / "tb"
    assert main(["--config", config, "export", "tensorboard", "--run", "a", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == (
        f"{out / 'a'}: 3 scalar tag(s), 10 point(s) in 1 event file(s); view with: tensorboard --logdir {out}"
    )
    events = _read(out / "a")
    assert sorted(events.Tags()["scalars"]) == ["arith/accuracy", "arith/quick/accuracy", "arith/wall_s"]
    for tag, stage, metric in (
        ("arith/accuracy", "full", "accuracy"),
        ("arith/quick/accuracy", "quick", "accuracy"),
        ("arith/wall_s", "full", "wall_s"),
    ):
        want = sorted(
            (r.step, r.value, r.evaluated_at.timestamp())
            for r in stored
            if (r.stage, r.metric) == (stage, metric)
        )
        got = [(e.step, e.value, e.wall_time) for e in events.Scalars(tag)]
        assert [g[0] for g in got] == [w[0] for w in want]
        # TensorBoard keeps a scalar as float32; the wall time is the job's finish time.
        assert [g[1] for g in got] == pytest.approx([w[1] for w in want], rel=1e-6)
        assert [g[2] for g in got] == pytest.approx([w[2] for w in want], abs=1e-3)

    # Again into the same folder: refused (it would duplicate every point), unless --replace.
    again = ["--config", config, "export", "tensorboard", "--run", "a", "--out", str(out)]
    assert main(again) == 1
    assert "already holds 1 TensorBoard event file(s)" in capsys.readouterr().err
    assert main([*again, "--replace"]) == 0
    capsys.readouterr()
    assert len(list((out / "a").glob("events.out.tfevents.*"))) == 1
    assert len(_read(out / "a").Scalars("arith/accuracy")) == 4

    assert main(["--config", config, "export", "tensorboard", "--run", "nope", "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == (
        "evald: error: run 'nope' has no stored results (runs with results: a, b)"
    )
    assert not (out / "nope").exists()


def test_run_name_is_one_safe_folder(tmp_path: Path) -> None:
    from daemon.export.tensorboard import run_folder

    assert run_folder(tmp_path, "exp/../../etc") == tmp_path / "exp_.._.._etc"
    assert run_folder(tmp_path, "..") == tmp_path / "_"
    assert run_folder(tmp_path, "grpo-7b_v2") == tmp_path / "grpo-7b_v2"
