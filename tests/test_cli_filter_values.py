"""The CLI refuses a filter value the database cannot take (text that is not UTF-8, a step beyond
PostgreSQL's INTEGER) as the API refuses it, with the same rule (daemon/filter_values.py): exit 2 and a
line naming the option and the value, never a traceback (issue 31). Values at the edge of the range go
through to the database on both backends and come back as ordinary answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli import main
from tests.deadlines import patient
from tests.harness import write_config, write_dataset
from tests.test_cli import _stored

HUGE = "99999999999999999999"
UNDECODABLE = "\udcff"  # what Python makes of the byte 0xff in argv

#: Every command with a name or step option, each with what it needs besides the value under test.
NAMED: list[tuple[list[str], str]] = [
    (["results"], "--run"),
    (["results"], "--task"),
    (["results"], "--metric"),
    (["alerts"], "--run"),
    (["compare", "--run", "toy"], "--run"),
    (["compare", "--run", "toy", "--run", "toy"], "--metric"),
    (["compare", "--run", "toy", "--run", "toy"], "--task"),
    (["plot", "--metric", "accuracy", "--out", "x.png"], "--run"),
    (["plot", "--run", "toy", "--out", "x.png"], "--metric"),
    (["plot", "--run", "toy", "--metric", "accuracy", "--out", "x.png"], "--task"),
    (["export", "tensorboard", "--out", "tb"], "--run"),
    (["export", "lm-eval", "--step", "5"], "--run"),
    (["export", "mlflow"], "--run"),
    (["export", "wandb"], "--run"),
    (["samples", "--step", "5", "--task", "arith"], "--run"),
    (["samples", "--step", "5", "--run", "toy"], "--task"),
    (["eval", "/nowhere"], "--task"),
]
STEPPED: list[tuple[list[str], str]] = [
    (["export", "lm-eval", "--run", "toy"], "--step"),
    (["samples", "--run", "toy", "--task", "arith"], "--step"),
]


@pytest.fixture
def config(database_url: str, tmp_path: Path) -> str:
    _stored(database_url).dispose()
    return str(write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "arith.jsonl", 4)))


def _refused(config: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["--config", config, *argv])
    assert exited.value.code == 2, argv
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err, argv
    return captured.err.strip().splitlines()[-1]


@pytest.mark.parametrize(("command", "option"), NAMED)
def test_undecodable_and_control_text_is_refused_naming_the_option(
    config: str, command: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = "evald " + " ".join(command[:2] if command[0] == "export" else command[:1])
    for value, shown in ((UNDECODABLE, r"'\xff'"), ("toy\x00", r"'toy\x00'"), ("a\nb", r"'a\nb'")):
        line = _refused(config, [*command, option, value], capsys)
        assert line == (
            f"{prog}: error: argument {option}: {shown} is not valid UTF-8 text, or holds control characters"
        )
    assert _refused(config, [*command, option, ""], capsys) == (
        f"{prog}: error: argument {option}: empty (leave it out to mean any)"
    )


@pytest.mark.parametrize(("command", "option"), STEPPED)
def test_out_of_range_steps_are_refused_naming_the_option(
    config: str, command: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = "evald " + " ".join(command[:2] if command[0] == "export" else command[:1])
    cases = {
        HUGE: f"{HUGE} is outside 0..2147483647",
        "2147483648": "2147483648 is outside 0..2147483647",
        "-1": "-1 is outside 0..2147483647",
        "1e3": "'1e3' is not an integer",
        "²": "'²' is not an integer",
    }
    for value, problem in cases.items():
        assert _refused(config, [*command, option, value], capsys) == (
            f"{prog}: error: argument {option}: {problem}"
        )


@pytest.mark.parametrize("option", ["--step-min", "--step-max"])
def test_results_step_bounds_are_refused_naming_the_option(
    config: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for value, problem in (
        (HUGE, f"{HUGE} is outside 0..2147483647"),
        ("-1", "-1 is outside 0..2147483647"),
        ("1e3", "'1e3' is not an integer"),
    ):
        assert main(["--config", config, "results", f"{option}={value}"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.strip().splitlines() == [f"evald: {option}: {problem}"]


def test_steps_range_is_refused_naming_the_option(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    for value, problem in (
        (f"1:{HUGE}", f"'1:{HUGE}': {HUGE} is outside 0..2147483647"),
        (f"{HUGE}:", f"'{HUGE}:': {HUGE} is outside 0..2147483647"),
        ("-5:10", "'-5:10': -5 is outside 0..2147483647"),
        ("10", "'10' is not A:B (e.g. 100:500, 100: or :500)"),
        ("a:b", "'a:b': 'a' is not an integer"),
    ):
        assert main(["--config", config, "results", f"--steps={value}"]) == 2
        captured = capsys.readouterr()
        assert captured.err.strip().splitlines() == [f"evald: --steps: {problem}"], value
    assert main(["--config", config, "results", "--steps", "9:3"]) == 2
    assert capsys.readouterr().err.strip() == (
        "evald: --steps: 9:3 is reversed: the lower step comes first (--steps 3:9)"
    )


def test_history_refuses_a_job_id_beyond_the_range(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _refused(config, ["history", HUGE], capsys) == (
        f"evald history: error: argument job: {HUGE} is outside 1..2147483647"
    )


def test_values_at_the_edge_reach_the_database_and_answer_plainly(
    config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    top = "2147483647"
    assert main(["--config", config, "results", "--step-min", top, "--format", "json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert main(["--config", config, "results", "--steps", f"0:{top}", "--format", "json"]) == 0
    assert '"accuracy"' in capsys.readouterr().out
    assert main(["--config", config, "samples", "--run", "toy", "--step", top, "--task", "arith"]) == 1
    assert capsys.readouterr().err.strip() == (
        f"evald: error: run 'toy' has no checkpoint at step {top} (steps: 5)"
    )
    assert main(["--config", config, "export", "lm-eval", "--run", "toy", "--step", top]) == 1
    assert "Traceback" not in capsys.readouterr().err
    # Any UTF-8 name is a name: one that is not there is said so, with the runs there are.
    assert main(["--config", config, "results", "--run", "ünïcode-ŕun"]) == 1
    assert capsys.readouterr().err.strip() == "evald: error: no run 'ünïcode-ŕun' (runs: toy)"
    assert main(["--config", config, "history", top]) == 1
    assert capsys.readouterr().err.strip() == f"evald: error: no job {top} (see `evald status` for job ids)"


def test_the_real_byte_in_argv_is_refused(config: str) -> None:
    """The byte itself, as a shell passes ``--run $'\\xff'`` (not the surrogate the tests above use)."""
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "--config", config, "results", "--run", b"\xff"],
        capture_output=True,
        timeout=patient(120),
    )
    assert done.returncode == 2
    assert done.stderr.decode().strip().splitlines()[-1] == (
        r"evald results: error: argument --run: '\xff' is not valid UTF-8 text, or holds control characters"
    )
