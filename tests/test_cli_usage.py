"""What a person meets on the command line when a command is asked for wrongly (issue 45): every usage
error exits 2 with one line naming the option, whatever the command; a reversed step range says it is
reversed and names the option given; a missing step lists the steps nearest to the one asked for, by
distance, and says where none lies beyond them. Each beside the good input that answers plainly. The
parsing of ``--steps`` and ``--smooth`` is held by properties over any text."""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.analysis.smoothing import Smoothing, parse_smoothing
from daemon.cli import main
from daemon.cli.parser import build_parser
from daemon.cli.results import step_range
from daemon.errors import ConfigError, SmoothingError
from daemon.filter_values import MAX_INT
from storage import queries
from storage.database import Database
from storage.models import CheckpointState
from storage.queries.samples import NEAREST_STEPS, nearest_steps
from tests.harness import evald, write_config, write_dataset

#: Both runs' steps: 1000 to 8000, so that a step below the first (400) has the first five as its nearest.
STEPS = tuple(range(1000, 8001, 1000))


def _record(database: Database, run: str, values: dict[int, float]) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, run, f"/{run}")
        for step, value in values.items():
            checkpoint = queries.record_checkpoint(
                s,
                run_id=run_id,
                path=f"/{run}/step_{step}",
                name=f"step_{step}",
                step=step,
                epoch=None,
                layout="hf",
                state=CheckpointState.READY,
            )
            queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=step, tasks=["arith"])
            job = queries.claim_next_job(s, "h:1")
            assert job is not None
            metrics = [queries.MetricRow("accuracy", value, 100, 0.05)]
            queries.complete_job(
                s, job_id=job.id, owner="h:1", duration_s=1.0, load_s=0.1, metrics=metrics, samples=[]
            )


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> Iterator[str]:
    """Runs ``a`` and ``b``, one arith job at each of :data:`STEPS`, on SQLite; no tracker configured."""
    tmp = tmp_path_factory.mktemp("cli-usage")
    shutil.copyfile(sqlite_template, tmp / "evald.db")
    url = f"sqlite:///{tmp / 'evald.db'}"
    database = Database(url)
    try:
        _record(database, "a", {step: 0.5 for step in STEPS})
        _record(database, "b", {step: 0.5 + step / 100_000 for step in STEPS})
    finally:
        database.dispose()
    yield str(write_config(tmp, url, dataset=write_dataset(tmp / "arith.jsonl", 4)))


def _run(config: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``main`` as the ``evald`` script runs it: an argparse refusal is its SystemExit's code."""
    try:
        code = main(["--config", config, *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


#: Each command asked for wrongly, and the line it must end with: the option (or command) and the fix.
USAGE_ERRORS: list[tuple[list[str], str]] = [
    (
        ["results", "--steps", "500:100"],
        "evald: --steps: 500:100 is reversed: the lower step comes first (--steps 100:500)",
    ),
    (
        ["results", "--step-min", "500", "--step-max", "100"],
        "evald: --step-min: 500 is above --step-max 100: the range is reversed "
        "(--step-min 100 --step-max 500)",
    ),
    (
        ["results", "--steps", "1:2", "--step-max", "5"],
        "evald: --steps: give --steps A:B or --step-min/--step-max, not both",
    ),
    (
        ["compare", "--run", "a", "--run", "b", "--smooth", "ema:2"],
        "evald compare: error: argument --smooth: smoothing 'ema:2': EMA weight must be in [0, 1); use "
        "'none', 'ema:W' with 0 <= W < 1 (e.g. ema:0.6), or 'window:N' with N odd >= 1 (e.g. window:5)",
    ),
    (
        ["plot", "--run", "a", "--metric", "accuracy", "--out", "x.png", "--smooth", "window:4"],
        "evald plot: error: argument --smooth: smoothing 'window:4': window width must be odd and >= 1; use "
        "'none', 'ema:W' with 0 <= W < 1 (e.g. ema:0.6), or 'window:N' with N odd >= 1 (e.g. window:5)",
    ),
    (
        ["compare", "--run", "a", "--run", "b", "--fdr", "2"],
        "evald: --fdr: must be a false discovery rate between 0 and 1 (e.g. 0.05), got 2.0",
    ),
    (["compare", "--run", "a"], "evald: --run: give exactly two runs (--run A --run B), got 1"),
    (
        ["plot", "--run", "a", "--metric", "accuracy", "--out", "x.gif"],
        "evald: --out: x.gif: cannot tell the format from '.gif' (write one of: .png, .pdf, .svg)",
    ),
    (
        ["export", "mlflow", "--run", "a"],
        "evald: export mlflow: no [[trackers]] table with kind = 'mlflow' in the config: add one "
        "(kind, tracking_uri/project, ...) and run this again",
    ),
    (["retry"], "evald: retry: give a job id (evald retry 42) or a run (evald retry --run R --failed)"),
    (["retry", "--run", "a"], "evald: --run: say which of the run's jobs: --failed, --cancelled or both"),
    (["webhook", "test", "nope"], "evald: webhook: unknown webhook 'nope' (known: none configured)"),
    (["serve", "--port", "70000"], "evald serve: error: argument --port: 70000 is outside 0..65535"),
    (["demo", "--port", "-1"], "evald demo: error: argument --port: -1 is outside 0..65535"),
    (["history", "0"], "evald history: error: argument job: 0 is outside 1..2147483647"),
    (
        ["samples", "--run", "a", "--task", "arith", "--step", "x"],
        "evald samples: error: argument --step: 'x' is not an integer",
    ),
]


@pytest.mark.parametrize(("argv", "line"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_every_usage_error_exits_2_naming_the_option(
    config: str, argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(config, argv, capsys)
    assert (code, out) == (2, "")
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == line


def test_a_missing_config_is_a_usage_error_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(str(tmp_path / "nope.toml"), ["results"], capsys)
    assert (code, out) == (2, "")
    assert (
        err.strip() == f"evald: {tmp_path / 'nope.toml'}: file not found (pass --config or set EVALD_CONFIG)"
    )


def test_the_same_ranges_and_smoothing_given_rightly_answer(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(config, ["results", "--run", "a", "--steps", "2000:4000", "--format", "csv"], capsys)
    assert code == 0
    assert [line.split(",")[2] for line in out.strip().splitlines()[1:]] == ["2000", "3000", "4000"]
    code, same, _ = _run(
        config,
        ["results", "--run", "a", "--step-min", "2000", "--step-max", "4000", "--format", "csv"],
        capsys,
    )
    assert (code, same) == (0, out)
    code, out, _ = _run(
        config, ["compare", "--run", "a", "--run", "b", "--smooth", "ema:0.6", "--format", "csv"], capsys
    )
    assert code == 0
    rows = [line.split(",") for line in out.strip().splitlines()]
    assert rows[0][:6] == ["run_a", "run_b", "task", "stage", "metric", "step"]
    assert [row[rows[0].index("smoothing")] for row in rows[1:]] == ["ema:0.6"] * len(STEPS)


def test_a_usage_error_exits_2_from_the_evald_process(config: str) -> None:
    """The process's own exit status, as a shell sees it, for a refusal by argparse and by the command."""
    smooth = evald("--config", config, "compare", "--run", "a", "--run", "b", "--smooth", "sideways")
    assert (smooth.returncode, smooth.stdout) == (2, "")
    assert "argument --smooth: smoothing 'sideways' is not a known spec" in smooth.stderr
    steps = evald("--config", config, "results", "--steps", "500:100")
    assert (steps.returncode, steps.stdout) == (2, "")
    assert (
        steps.stderr.strip()
        == "evald: --steps: 500:100 is reversed: the lower step comes first (--steps 100:500)"
    )


@pytest.mark.parametrize(
    ("step", "hint"),
    [
        # Below the first step: the nearest are the first five, and the message says none lies below.
        (400, "nearest steps: 1000, 2000, 3000, 4000, 5000 (of 8; none below 1000)"),
        # Between: by distance from 4400 (4000, 5000, 3000, 6000, 2000), not the first five.
        (4400, "nearest steps: 2000, 3000, 4000, 5000, 6000 (of 8)"),
        (8100, "nearest steps: 4000, 5000, 6000, 7000, 8000 (of 8; none above 8000)"),
    ],
)
def test_a_missing_step_lists_the_nearest_by_distance(
    config: str, step: int, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(config, ["samples", "--run", "a", "--task", "arith", "--step", str(step)], capsys)
    assert (code, out) == (1, "")
    assert err.strip() == f"evald: error: run 'a' has no checkpoint at step {step} ({hint})"


def test_a_step_that_exists_shows_its_job(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(config, ["samples", "--run", "a", "--task", "arith", "--step", "4000"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith("run a, step 4000 (step_4000), task arith, stage full, job ")


@settings(deadline=None)  # a loaded machine's pause is no failure
@given(
    steps=st.lists(st.integers(0, 10_000), min_size=1, max_size=40),
    step=st.integers(0, 10_000),
)
def test_the_nearest_steps_are_the_closest(steps: list[int], step: int) -> None:
    """No step left out is closer to the one asked for than a step listed; the list is in step order."""
    nearest = nearest_steps(steps, step)
    assert nearest == sorted(set(nearest)) and set(nearest) <= set(steps)
    assert len(nearest) == min(NEAREST_STEPS, len(set(steps)))
    farthest = max(abs(s - step) for s in nearest)
    assert all(abs(s - step) >= farthest for s in set(steps) - set(nearest))


#: Text around the shape ``--steps`` takes: numbers in and out of range, empty sides, junk, whitespace.
_SIDE = st.one_of(
    st.integers(-5, MAX_INT + 5).map(str),
    st.just(""),
    st.sampled_from([" 7", "7 ", "1e3", "²", "0x10", "-0"]),
    st.text(max_size=4),
)


@settings(deadline=None)
@given(st.one_of(st.text(max_size=12), st.tuples(_SIDE, _SIDE).map(lambda p: f"{p[0]}:{p[1]}")))
def test_steps_are_a_range_or_a_usage_error_naming_steps(text: str) -> None:
    try:
        low, high = step_range(text, None, None)
    except ConfigError as exc:
        assert exc.source == "--steps"
        [problem] = exc.problems
        assert problem and "\n" not in problem
        return
    left, _, right = text.partition(":")
    assert low == (int(left) if left.strip() else None)
    assert high == (int(right) if right.strip() else None)
    assert all(0 <= b <= MAX_INT for b in (low, high) if b is not None)
    assert low is None or high is None or low <= high


#: One parser for every example (it is built from the same definitions each time).
PARSER = build_parser()


@settings(deadline=None)
@given(st.text(max_size=16))
def test_smooth_is_a_spec_or_a_usage_error_naming_smooth(text: str) -> None:
    """``--smooth=TEXT`` gives what :func:`parse_smoothing` gives, or exits 2 naming ``--smooth`` where it
    refuses the text: never an exit 1 from the command, never a traceback."""
    argv = ["compare", "--run", "a", "--run", "b", f"--smooth={text}"]
    said = io.StringIO()
    try:
        expected: Smoothing | None = parse_smoothing(text)
    except SmoothingError:
        expected = None
    with contextlib.redirect_stderr(said):
        try:
            args: argparse.Namespace | None = PARSER.parse_args(argv)
        except SystemExit as exc:
            assert exc.code == 2
            args = None
    if expected is None:
        assert args is None and "error: argument --smooth: smoothing " in said.getvalue()
    else:
        assert args is not None and args.smooth == expected
