"""``evald plot``: a real PNG from stored runs, with its bands, alert markers and best checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from daemon.cli import main
from tests import surface_data
from tests.surface_data import Stored

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

surfaces = surface_data.surfaces_fixture()


def test_plot_two_runs_with_alerts_and_best(
    surfaces: Stored, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plots" / "curve.png"
    args = [
        "--config",
        surfaces.config,
        "plot",
        "--run",
        "a",
        "--run",
        "b",
        "--metric",
        "accuracy",
        "--stage",
        "full",
    ]
    assert main([*args, "--smooth", "ema:0.6", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    # a's drop_from_best (firing, step 40) and b's robust_z (resolved, step 20) on the curves, a's eval_failed
    # (no metric, step 30) as a line; accuracy is higher-is-better: a is best at 30, b at 50.
    assert line == (
        f"{out}: 2 curve(s), 8 point(s), 3 alert marker(s); best a: step 30 (0.5); best b: step 50 (0.7)"
    )
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1200, 660)
        # Not a blank canvas: the curves, bands and markers put many colours on it.
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50


def test_plot_both_stages_and_a_metric_without_direction(
    surfaces: Stored, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "one.png"
    assert (
        main(["--config", surfaces.config, "plot", "--run", "a", "--metric", "accuracy", "--out", str(out)])
        == 0
    )
    assert capsys.readouterr().out.startswith(f"{out}: 2 curve(s), 6 point(s), 2 alert marker(s)")
    custom = tmp_path / "wall.png"
    assert (
        main(["--config", surfaces.config, "plot", "--run", "b", "--metric", "wall_s", "--out", str(custom)])
        == 0
    )
    # wall_s is lower-is-better in the registry: its best is the fastest evaluation.
    assert capsys.readouterr().out.strip().endswith("best b: step 10 (0.7)")
    assert custom.read_bytes()[:8] == PNG_SIGNATURE


def test_plot_bad_input(surfaces: Stored, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--config", surfaces.config, "plot", "--out", str(tmp_path / "x.png")]
    assert main([*base, "--run", "zz", "--metric", "accuracy"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == "evald: error: run 'zz' has no stored results (runs with results: a, b)"
    )
    assert main([*base, "--run", "a", "--metric", "bleu"]) == 1
    assert capsys.readouterr().err.strip() == (
        "evald: error: run 'a' has no metric 'bleu' here (its metrics: accuracy, wall_s)"
    )
    assert main([*base, "--run", "a", "--metric", "accuracy", "--smooth", "gauss"]) == 1
    assert "smoothing 'gauss' is not a known spec" in capsys.readouterr().err
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert (
        main(
            [
                "--config",
                surfaces.config,
                "plot",
                "--run",
                "a",
                "--metric",
                "accuracy",
                "--out",
                str(blocked / "x.png"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"evald: error: {blocked / 'x.png'}: cannot write the plot")
    assert not (tmp_path / "x.png").exists()
