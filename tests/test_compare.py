"""``evald compare``: two runs at matched steps, on both backends, against values worked out by hand."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from daemon.analysis import report
from daemon.analysis.curves import compare, curves
from daemon.analysis.significance import benjamini_hochberg
from daemon.analysis.smoothing import parse_smoothing
from daemon.cli import main
from storage.database import Database
from storage.models import CheckpointState
from storage.queries import (
    MetricRow,
    ResultRow,
    SampleRow,
    claim_next_job,
    complete_job,
    enqueue_jobs,
    ensure_run,
    record_checkpoint,
)
from storage.queries.grades import Grade
from tests import surface_data
from tests.deadlines import wait_process
from tests.harness import write_config, write_dataset
from tests.surface_data import Stored

NOW = datetime(2026, 1, 1, tzinfo=UTC)
COMBINED = math.hypot(0.05, 0.04)

surfaces = surface_data.surfaces_fixture()


def _row(run: str, step: int | None, value: float, stderr: float | None, stage: str = "full") -> ResultRow:
    return ResultRow(run, f"step_{step}", step, None, "t", stage, "acc", value, 10, stderr, NOW)


def _p(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


def test_compare_matches_steps_and_tests_the_difference() -> None:
    a = curves(
        [_row("a", 2, 0.5, 0.1), _row("a", 1, 0.2, 0.1), _row("a", None, 0.9, 0.1), _row("a", 3, 0.1, 0.1)]
    )
    b = curves([_row("b", 1, 0.25, 0.1), _row("b", 2, 0.9, 0.1), _row("b", 4, 0.3, None)])
    assert [p.step for p in a[0].points] == [1, 2, 3]  # sorted; the step-less checkpoint has no place
    found = compare(a, b, run_a="a", run_b="b")
    assert [(d.step, round(d.diff, 9)) for d in found.differences] == [(1, 0.05), (2, 0.4)]
    # No samples: independent z-tests, 0.05 / 0.1414 and 0.4 / 0.1414; Benjamini-Hochberg over the two.
    z = [0.05 / math.hypot(0.1, 0.1), 0.4 / math.hypot(0.1, 0.1)]
    assert [d.test.kind if d.test else None for d in found.differences] == ["independent"] * 2
    assert [d.test.p for d in found.differences if d.test] == pytest.approx([_p(x) for x in z])
    assert [d.p_adjusted for d in found.differences] == pytest.approx([_p(z[0]), 2 * _p(z[1])])
    assert [d.differs(0.05) for d in found.differences] == [False, True]
    assert found.differences[1].differs(0.005) is False  # adjusted 0.0093
    assert found.unmatched == ()
    assert {d.why for d in found.differences} == {"acc is not rebuilt from samples"}


def test_unknown_stderr_or_nan_is_no_verdict_and_unmatched_series_are_named() -> None:
    a = curves([_row("a", 1, 0.2, None), _row("a", 2, math.nan, 0.1), _row("a", 1, 0.2, 0.1, stage="quick")])
    b = curves([_row("b", 1, 0.9, 0.1), _row("b", 2, 0.9, 0.1), _row("b", 7, 0.1, 0.1, stage="x")])
    found = compare(a, b, run_a="a", run_b="b")
    assert [d.differs(0.05) for d in found.differences] == [None, None]
    assert found.tested == 0
    assert found.unmatched == ("t/quick/acc only in a", "t/x/acc only in b")
    text = report.comparison(found, "table")
    assert "not compared: t/quick/acc only in a" in text and "Benjamini-Hochberg adjusted p <= 0.05" in text


def test_benjamini_hochberg_against_worked_values() -> None:
    # m = 4: sorted 0.01, 0.02, 0.03, 0.5 -> 0.04, 0.04, 0.04, 0.5 (each is min over the later m p / rank).
    assert benjamini_hochberg([0.5, 0.01, 0.03, 0.02]) == pytest.approx([0.5, 0.04, 0.04, 0.04])
    assert benjamini_hochberg([]) == []
    assert benjamini_hochberg([0.9, 0.95]) == pytest.approx([0.95, 0.95])


def test_compare_command_on_stored_runs(surfaces: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--config", surfaces.config, "compare", "--run", "a", "--run", "b", "--metric", "accuracy"]
    assert main([*args, "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert (found["run_a"], found["run_b"], found["fdr"], found["smoothing"]) == ("a", "b", 0.05, "none")
    rows = [(r["stage"], r["step"], round(r["diff"], 9), r["test"], r["differs"]) for r in found["rows"]]
    # Steps 10, 20, 30 are in both, stored without samples: independent tests; only 0.2 (z = 3.1) differs
    # after Benjamini-Hochberg over the 3 points.
    assert rows == [
        ("full", 10, 0.05, "independent", False),
        ("full", 20, 0.2, "independent", True),
        ("full", 30, 0.02, "independent", False),
    ]
    assert found["rows"][0]["combined_stderr"] == pytest.approx(COMBINED)
    assert found["rows"][1]["p_adjusted"] == pytest.approx(3 * _p(0.2 / COMBINED))
    assert (found["tested"], found["paired"], found["differ"]) == (3, 0, 1)
    assert found["unmatched"] == ["arith/quick/accuracy only in a"]

    assert main([*args, "--format", "csv", "--stage", "full", "--fdr", "0.001"]) == 0
    parsed = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["step"], r["differs"], r["fdr"]) for r in parsed] == [
        ("10", "False", "0.001"),
        ("20", "False", "0.001"),  # adjusted 0.0054 > 0.001
        ("30", "False", "0.001"),
    ]

    assert main([*args, "--stage", "full"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0] == (
        "a vs b: 3 matched point(s), 3 tested (0 paired), 1 differ at false discovery rate 0.05"
    )
    assert "differs when the Benjamini-Hochberg adjusted p <= 0.05 (false discovery rate over the 3" in table
    assert "not paired: no samples stored" in table


def test_smoothing_is_shown_but_never_changes_a_verdict(
    surfaces: Stored, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 20: ``--smooth`` narrowed the error and changed verdicts. The smoothed values a chart shows
    are printed beside the raw ones; the test is the raw one, the same with any smoothing."""
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
    assert main([*args, "--format", "json"]) == 0
    raw = json.loads(capsys.readouterr().out)
    assert main([*args, "--smooth", "ema:0.5", "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["smoothing"] == "ema:0.5"
    # Debiased EMA with w = 0.5 weighs the points 1, 2, 4 (/7), over each run's whole series.
    a = [0.2, (0.2 + 2 * 0.4) / 3, (0.2 + 2 * 0.4 + 4 * 0.5) / 7]
    b = [0.25, (0.25 + 2 * 0.6) / 3, (0.25 + 2 * 0.6 + 4 * 0.52) / 7]
    assert [r["smoothed_a"] for r in found["rows"]] == pytest.approx(a)
    assert [r["smoothed_b"] for r in found["rows"]] == pytest.approx(b)
    verdict = ("value_a", "value_b", "diff", "test_stderr", "p", "p_adjusted", "differs")
    assert [{k: r[k] for k in verdict} for r in found["rows"]] == [
        {k: r[k] for k in verdict} for r in raw["rows"]
    ]
    assert raw["rows"][0]["smoothed_a"] is None
    assert "shown for display only, never tested" in found["rule"]
    assert main([*args, "--smooth", "window:3"]) == 0
    text = capsys.readouterr().out
    assert "a~, b~: smoothed (window:3), for display only" in text
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
    ],
)
def test_bad_input_is_one_line_naming_what_exists(
    surfaces: Stored, extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", surfaces.config, "compare", *extra]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [message]


def test_a_bad_smoothing_is_a_usage_error(surfaces: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused by the parser, exit 2 like any malformed option (tests/test_cli_usage.py has the rest)."""
    with pytest.raises(SystemExit) as exited:
        main(["--config", surfaces.config, "compare", "--run", "a", "--run", "b", "--smooth", "ema:2"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "evald compare: error: argument --smooth: smoothing 'ema:2': EMA weight must be in [0, 1); use "
        "'none', 'ema:W' with 0 <= W < 1 (e.g. ema:0.6), or 'window:N' with N odd >= 1 (e.g. window:5)"
    )


def test_compare_needs_two_runs(surfaces: Stored, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", surfaces.config, "compare", "--run", "a"]) == 2
    assert capsys.readouterr().err.strip() == "evald: --run: give exactly two runs (--run A --run B), got 1"


@pytest.mark.parametrize("fdr", ["1.5", "0", "-0.1", "nan"])
def test_a_false_discovery_rate_outside_0_1_is_refused(
    surfaces: Stored, fdr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", surfaces.config, "compare", "--run", "a", "--run", "b", "--fdr", fdr]) == 2
    assert capsys.readouterr().err.strip() == (
        f"evald: --fdr: must be a false discovery rate between 0 and 1 (e.g. 0.05), got {float(fdr)}"
    )


def test_a_reader_that_stops_early_gets_no_traceback(surfaces: Stored) -> None:
    """`evald results | head`: the reader has gone before evald writes; evald stops quietly."""
    command = [sys.executable, "-m", "daemon", "--config", surfaces.config, "results", "--format", "json"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    errors = process.stderr.read().decode()
    assert wait_process(process, 60) == 141, errors
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors


# --- paired: two runs graded on the same prompts, stored with their samples ---

PROMPTS = 200


def _graded(correct: list[bool], *, per_prompt: int = 1) -> list[SampleRow]:
    return [
        SampleRow(i * per_prompt + k, f"p{i}", f"q{i}", "r", "1", "1", ok, 5, False, float(ok))
        for i, ok in enumerate(correct)
        for k in range(per_prompt)
    ]


def _store_job(
    database: Database, run: str, step: int, samples: list[SampleRow], *, n: int | None = None
) -> None:
    hits = [bool(s.correct) for s in samples]
    accuracy = sum(hits) / len(hits)
    q = (sum(hits) + 2) / (len(hits) + 4)
    metrics = [
        MetricRow("accuracy", accuracy, n or len(hits), math.sqrt(q * (1 - q) / (len(hits) + 4))),
        MetricRow("wall_s", 1.0, None, None),
    ]
    with database.session() as s:
        run_id = ensure_run(s, run, f"/{run}")
        checkpoint = record_checkpoint(
            s,
            run_id=run_id,
            path=f"/{run}/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=["arith"])
        job = claim_next_job(s, "h:1")
        assert job is not None
        assert complete_job(
            s, job_id=job.id, owner="h:1", metrics=metrics, samples=samples, duration_s=1.0, load_s=0.1
        )


def test_runs_graded_on_the_same_prompts_are_compared_paired(
    database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 20: B solves the 100 prompts A solves and 12 more. As independent estimates (0.50 vs 0.56,
    combined stderr 0.05) that is noise; paired, prompt by prompt, 12 discordant prompts all one way is
    not. Step 20: identical grades (p = 1). Step 30: B stored only part of its samples (max_samples), so
    pairing would use a biased subset: it falls back to the independent test and says why."""
    a_grades = [i < 100 for i in range(PROMPTS)]
    b_grades = [i < 112 for i in range(PROMPTS)]
    for step in (10, 20, 30):
        _store_job(database, "a", step, _graded(a_grades))
    _store_job(database, "b", 10, _graded(b_grades))
    _store_job(database, "b", 20, _graded(a_grades))
    _store_job(database, "b", 30, _graded(b_grades)[:150], n=PROMPTS)
    config = write_config(tmp_path, database.url, dataset=write_dataset(tmp_path / "d.jsonl", 2))
    args = ["--config", str(config), "compare", "--run", "a", "--run", "b", "--stage", "full"]

    assert main([*args, "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)

    rows = {(r["metric"], r["step"]): r for r in found["rows"]}
    ten, twenty, thirty = (rows[("accuracy", s)] for s in (10, 20, 30))
    d = [1.0] * 12 + [0.0] * (PROMPTS - 12)
    se = statistics.stdev(d) / math.sqrt(PROMPTS)
    assert (ten["test"], ten["pairs"], ten["diff"]) == ("paired", PROMPTS, pytest.approx(0.06))
    assert ten["test_stderr"] == pytest.approx(se) and ten["z"] == pytest.approx(0.06 / se)
    assert ten["differs"] is True
    # The independent test of the same numbers would not have seen it.
    assert abs(ten["diff"]) / ten["combined_stderr"] < 2
    assert (twenty["test"], twenty["p"], twenty["differs"]) == ("paired", 1.0, False)
    assert (thirty["test"], thirty["why_not_paired"]) == (
        "independent",
        "stored samples are not all of the job's",
    )
    # wall_s has no standard error: no verdict, and not counted among the points tested.
    assert rows[("wall_s", 10)]["differs"] is None
    assert (found["tested"], found["paired"]) == (3, 2)
    tested = [r["p"] for r in found["rows"] if r["p"] is not None]
    assert [r["p_adjusted"] for r in found["rows"] if r["p"] is not None] == pytest.approx(
        benjamini_hochberg(tested)
    )

    assert main(args) == 0
    text = capsys.readouterr().out
    assert "paired(200)" in text and "paired z-test over shared prompts" in text
    assert "not paired: stored samples are not all of the job's" in text
    assert "no verdict: no standard error" in text


A_TWICE = [1, 1, 0, 0, 1, 1, 0, 0]
B_TWICE = [1, 1, 1, 0, 1, 1, 1, 0]


def test_several_completions_per_prompt_pair_by_prompt() -> None:
    """With 2 completions per prompt, the unit paired is the prompt (its mean grade), not the sample."""
    a = curves([ResultRow("a", "s", 1, None, "t", "full", "accuracy", 0.5, 8, 0.1, NOW)])
    b = curves([ResultRow("b", "s", 1, None, "t", "full", "accuracy", 0.75, 8, 0.1, NOW)])
    grades_a = {
        ("t", "full", 1): {
            1: [
                Grade(f"p{i // 2}", bool(ok), 5, False, None) for i, ok in enumerate([1, 1, 0, 0, 1, 1, 0, 0])
            ]
        }
    }
    grades_b = {
        ("t", "full", 1): {
            2: [
                Grade(f"p{i // 2}", bool(ok), 5, False, None) for i, ok in enumerate([1, 1, 1, 0, 1, 1, 1, 0])
            ]
        }
    }

    [row] = compare(a, b, run_a="a", run_b="b", grades_a=grades_a, grades_b=grades_b).differences

    # Per-prompt differences 0, 0.5, 0, 0.5: mean 0.25, sd 0.2887, se 0.1443 over 4 prompts.
    assert row.test is not None and (row.test.kind, row.test.pairs) == ("paired", 4)
    assert row.test.stderr == pytest.approx(statistics.stdev([0, 0.5, 0, 0.5]) / 2)
