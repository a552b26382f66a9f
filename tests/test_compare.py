"""``evald compare``: two runs at matched steps, on both backends, against values worked out by hand."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from daemon import report
from daemon.cli import main
from daemon.curves import compare, curves
from daemon.smoothing import parse_smoothing
from storage.queries import ResultRow
from tests import surface_data
from tests.surface_data import Stored

NOW = datetime(2026, 1, 1, tzinfo=UTC)
COMBINED = math.hypot(0.05, 0.04)

surfaces = surface_data.surfaces_fixture()


def _row(run: str, step: int | None, value: float, stderr: float | None, stage: str = "full") -> ResultRow:
    return ResultRow(run, f"step_{step}", step, None, "t", stage, "acc", value, 10, stderr, NOW)


def test_compare_matches_steps_and_tests_the_difference() -> None:
    a = curves(
        [_row("a", 2, 0.5, 0.1), _row("a", 1, 0.2, 0.1), _row("a", None, 0.9, 0.1), _row("a", 3, 0.1, 0.1)]
    )
    b = curves([_row("b", 1, 0.25, 0.1), _row("b", 2, 0.9, 0.1), _row("b", 4, 0.3, None)])
    assert [p.step for p in a[0].points] == [1, 2, 3]  # sorted; the step-less checkpoint has no place
    found = compare(a, b, run_a="a", run_b="b")
    assert [(d.step, round(d.diff, 9)) for d in found.differences] == [(1, 0.05), (2, 0.4)]
    # sqrt(0.1² + 0.1²) = 0.1414; 2 x 0.1414 = 0.283: 0.05 is within, 0.4 beyond.
    assert [d.exceeds(2.0) for d in found.differences] == [False, True]
    assert found.differences[1].exceeds(3.0) is False  # 3 x 0.1414 = 0.424
    assert found.unmatched == ()


def test_unknown_stderr_or_nan_is_no_verdict_and_unmatched_series_are_named() -> None:
    a = curves([_row("a", 1, 0.2, None), _row("a", 2, math.nan, 0.1), _row("a", 1, 0.2, 0.1, stage="quick")])
    b = curves([_row("b", 1, 0.9, 0.1), _row("b", 2, 0.9, 0.1), _row("b", 7, 0.1, 0.1, stage="x")])
    found = compare(a, b, run_a="a", run_b="b")
    assert [d.exceeds(2.0) for d in found.differences] == [None, None]
    assert found.unmatched == ("t/quick/acc only in a", "t/x/acc only in b")
    text = report.comparison(found, "table")
    assert "not compared: t/quick/acc only in a" in text and "exceeds when |diff| > 2 x" in text


def test_compare_command_on_stored_runs(surfaces: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--config", surfaces.config, "compare", "--run", "a", "--run", "b", "--metric", "accuracy"]
    assert main([*args, "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["run_a"], found["run_b"], found["sigmas"], found["smoothing"]) == ("a", "b", 2.0, "none")
    rows = [(r["stage"], r["step"], round(r["diff"], 9), r["exceeds"]) for r in found["rows"]]
    # Steps 10, 20, 30 are in both; 0.05 and 0.02 are within 2 x 0.064, 0.2 is beyond.
    assert rows == [("full", 10, 0.05, False), ("full", 20, 0.2, True), ("full", 30, 0.02, False)]
    assert found["rows"][0]["combined_stderr"] == pytest.approx(COMBINED)
    assert found["unmatched"] == ["arith/quick/accuracy only in a"]

    assert main([*args, "--format", "csv", "--stage", "full", "--sigmas", "4"]) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["step"], r["exceeds"], r["sigmas"]) for r in parsed] == [
        ("10", "False", "4.0"),
        ("20", "False", "4.0"),  # 0.2 < 4 x 0.064 = 0.256
        ("30", "False", "4.0"),
    ]

    assert main([*args, "--stage", "full"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0] == "a vs b: 3 matched point(s), 1 beyond noise"
    assert "diff = b - a; exceeds when |diff| > 2 x sqrt(stderr_a^2 + stderr_b^2); smoothing none" in table


def test_compare_with_smoothing(surfaces: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "--config",
        surfaces.config,
        "compare",
        "--run",
        "a",
        "--run",
        "b",
        "--metric",
        "accuracy",
        "--stage",
        "full",
    ]
    assert main([*args, "--smooth", "ema:0.5", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["smoothing"] == "ema:0.5"
    # Debiased EMA with w = 0.5 weighs the points 1, 2, 4 (/7), over each run's whole series.
    a = [0.2, (0.2 + 2 * 0.4) / 3, (0.2 + 2 * 0.4 + 4 * 0.5) / 7]
    b = [0.25, (0.25 + 2 * 0.6) / 3, (0.25 + 2 * 0.6 + 4 * 0.52) / 7]
    assert [r["value_a"] for r in found["rows"]] == pytest.approx(a)
    assert [r["value_b"] for r in found["rows"]] == pytest.approx(b)
    shrink = [1.0, math.sqrt(5) / 3, math.sqrt(21) / 7]
    assert [r["combined_stderr"] for r in found["rows"]] == pytest.approx([COMBINED * k for k in shrink])
    assert [r["exceeds"] for r in found["rows"]] == [False, True, False]
    assert main([*args, "--smooth", "window:3", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["value_a"] == pytest.approx((0.2 + 0.4) / 2)
    assert rows[1]["value_b"] == pytest.approx((0.25 + 0.6 + 0.52) / 3)
    assert parse_smoothing("window:3").spec == "window:3"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--run", "a", "--run", "zz"],
            "evald: error: run 'zz' has no stored results (runs with results: a, b)",
        ),
        (
            ["--run", "a", "--run", "b", "--metric", "nope"],
            "evald: error: run 'a' has no metric 'nope' here (its metrics: accuracy, wall_s)",
        ),
        (
            ["--run", "a", "--run", "b", "--task", "nope"],
            "evald: error: run 'a' has no task 'nope' here (its tasks: arith)",
        ),
        (
            ["--run", "a", "--run", "b", "--smooth", "ema:2"],
            "evald: error: smoothing 'ema:2': EMA weight must be in [0, 1); use 'none', 'ema:W' with "
            "0 <= W < 1 (e.g. ema:0.6), or 'window:N' with N odd >= 1 (e.g. window:5)",
        ),
    ],
)
def test_bad_input_is_one_line_naming_what_exists(
    surfaces: Stored, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", surfaces.config, "compare", *extra]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_compare_needs_two_runs(surfaces: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", surfaces.config, "compare", "--run", "a"]) == 2
    assert capsys.readouterr().err.strip() == "evald: --run: give exactly two runs (--run A --run B), got 1"


def test_a_reader_that_stops_early_gets_no_traceback(surfaces: Stored) -> None:
    """`evald results | head`: the reader has gone before evald writes; evald stops quietly."""
    command = [sys.executable, "-m", "daemon", "--config", surfaces.config, "results", "--format", "json"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    errors = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141, errors
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
