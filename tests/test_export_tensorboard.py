"""``evald export tensorboard``: event files written by the real SummaryWriter, read back with
TensorBoard's own EventAccumulator and compared with the database."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
    EventAccumulator,
)
from tensorboard.plugins.custom_scalar import layout_pb2  # type: ignore[import-untyped]
from tensorboard.plugins.custom_scalar import metadata as custom_scalar_metadata

from daemon.alerts.lifecycle import fingerprint
from daemon.cli import main
from daemon.export.tensorboard import FIELD_CHARS, SAMPLES_PER_STEP
from storage import queries
from storage.database import Database
from storage.models import Alert, AlertState, CheckpointState
from tests import surface_data
from tests.harness import upgraded, write_config, write_dataset


def _read(folder: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def _string(event: Any) -> str:
    """A text summary's Markdown, as TensorBoard's text plugin reads it."""
    value: bytes = event.tensor_proto.string_val[0]
    return value.decode("utf-8")


def _layout(events: EventAccumulator) -> layout_pb2.Layout:
    """The Custom Scalars layout, parsed from the tensor the plugin reads."""
    (config,) = events.Tensors(custom_scalar_metadata.CONFIG_SUMMARY_TAG)
    return layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])


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
        f"{out / 'a'}: 3 scalar tag(s), 10 point(s), 2 stderr margin chart(s), 0 sample text(s), "
        f"2 alert text(s) in 1 event file(s); view with: tensorboard --logdir {out}"
    )
    events = _read(out / "a")
    assert sorted(events.Tags()["scalars"]) == [
        "arith/accuracy",
        "arith/quick/accuracy",
        "arith/wall_s",
        "stderr_band/arith/accuracy/lower",
        "stderr_band/arith/accuracy/upper",
        "stderr_band/arith/quick/accuracy/lower",
        "stderr_band/arith/quick/accuracy/upper",
    ]
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
        if metric == "accuracy":
            # The margin chart's bounds: value ∓ stderr at each step, at float32.
            for side, sign in (("lower", -1), ("upper", 1)):
                band = [(e.step, e.value) for e in events.Scalars(f"stderr_band/{tag}/{side}")]
                rows = sorted(
                    (r.step, r.value, r.stderr or 0.0)
                    for r in stored
                    if (r.stage, r.metric) == (stage, metric)
                )
                assert [b[0] for b in band] == [r[0] for r in rows]
                assert [b[1] for b in band] == pytest.approx([v + sign * se for _, v, se in rows], rel=1e-6)
    layout = _layout(events)
    assert {c.title: [chart.title for chart in c.chart] for c in layout.category} == {
        "arith (value ± 1 stderr)": ["accuracy", "quick/accuracy"]
    }
    (chart,) = [ch for c in layout.category for ch in c.chart if ch.title == "accuracy"]
    (series,) = chart.margin.series
    assert (series.value, series.lower, series.upper) == (
        "arith/accuracy",
        "stderr_band/arith/accuracy/lower",
        "stderr_band/arith/accuracy/upper",
    )
    # Alerts as text at their onset: a's eval_failed (step 30) and drop_from_best (step 40).
    alerts = {e.step: _string(e) for e in events.Tensors("alerts")}
    assert sorted(alerts) == [30, 40]
    assert "**drop\\_from\\_best** on accuracy (arith), warning, firing" in alerts[40]
    assert "eval\\_failed" in alerts[30] and "(evaluation)" in alerts[30]

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


def _store_sampled(database: Database) -> None:
    """Run ``s``: two steps with 20 graded samples each (awkward text among them), a metric over zero
    samples at step 20, and an alert that first fired at step 20."""
    with database.session() as session:
        run_id = queries.ensure_run(session, "s", "/s")
    for step in (10, 20):
        samples = [
            queries.SampleRow(
                index=i,
                prompt_id=f"p{i}",
                prompt="what is 2|3?\nanswer on one line" if i == 0 else f"{i}+{step}",
                response="x" * (FIELD_CHARS + 50) if i == 1 else str(i + step if i % 3 else -1),
                extracted=None if i == 1 else str(i + step if i % 3 else -1),
                reference=str(i + step),
                correct=bool(i % 3) and i != 1,
                tokens=3,
                truncated=False,
            )
            for i in range(20)
        ]
        metrics = [queries.MetricRow("accuracy", 0.6, 20, 0.1)]
        if step == 20:
            metrics.append(queries.MetricRow("length_correct", 0.0, 0, None))
        with database.session() as session:
            checkpoint_id = queries.record_checkpoint(
                session,
                run_id=run_id,
                path=f"/s/step_{step}",
                name=f"step_{step}",
                step=step,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(session, checkpoint_id=checkpoint_id, step=step, tasks=["arith"])
            job = queries.claim_next_job(session, "h:1")
            assert job is not None
            assert queries.complete_job(
                session,
                job_id=job.id,
                owner="h:1",
                metrics=metrics,
                samples=samples,
                duration_s=1.0,
                load_s=0.1,
            )
    with database.session() as session:
        session.add(
            Alert(
                fingerprint=fingerprint("s", "drop_from_best", "accuracy", "arith"),
                run_id=run_id,
                task="arith",
                metric="accuracy",
                rule="drop_from_best",
                severity="critical",
                state=AlertState.FIRING,
                first_step=20,
                last_step=20,
                message="accuracy 0.6 is 0.3 below its smoothed best",
            )
        )


def test_samples_are_text_bounded_and_zero_sample_metrics_left_out(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = upgraded(database_url)
    try:
        _store_sampled(database)
    finally:
        database.dispose()
    config = str(write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "d.jsonl", 2)))
    out = tmp_path / "tb"
    assert main(["--config", config, "export", "tensorboard", "--run", "s", "--out", str(out)]) == 0
    assert ", 2 sample text(s), 1 alert text(s) in 1 event file(s)" in capsys.readouterr().out
    events = _read(out / "s")
    # length_correct had n = 0 at its only step: no point at all, not a 0.
    assert "arith/length_correct" not in events.Tags()["scalars"]
    assert [(e.step, e.value) for e in events.Scalars("arith/accuracy")] == [
        (10, pytest.approx(0.6)),
        (20, pytest.approx(0.6)),
    ]
    texts = {e.step: _string(e) for e in events.Tensors("samples/arith")}
    assert sorted(texts) == [10, 20]
    table = texts[20]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    assert len(rows) == SAMPLES_PER_STEP
    # Wrong first (indices 0, 1, 3, 6, 9, 12, 15, 18 are wrong), then right ones by index.
    assert [int(r.split("|")[1]) for r in rows] == [0, 1, 3, 6, 9, 12, 15, 18, 2, 4, 5, 7, 8, 10, 11, 13]
    assert f"{SAMPLES_PER_STEP} of 20 stored sample(s) shown, 8 graded wrong" in table
    assert "`evald samples --run s --step 20 --task arith --stage full`" in table
    # Awkward text stays inside its cell: the pipe escaped, the newline shown, the long response cut.
    assert "what is 2\\|3? ⏎ answer on one line" in table
    assert "x" * FIELD_CHARS + " … (+50 chars)" in table and "x" * (FIELD_CHARS + 1) not in table
    # Six cells per row: seven pipes that are not escaped.
    assert all(len(re.findall(r"(?<!\\)\|", r)) == 7 for r in rows), rows
    (alert,) = events.Tensors("alerts")
    assert alert.step == 20 and "critical, firing" in _string(alert)
