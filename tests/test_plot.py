"""``evald plot``: a real PNG from stored runs, with its bands, alert markers and best checkpoints."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

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
    with pytest.raises(SystemExit) as exited:  # a usage error: the parser's, exit 2
        main([*base, "--run", "a", "--metric", "accuracy", "--smooth", "gauss"])
    assert exited.value.code == 2
    assert "argument --smooth: smoothing 'gauss' is not a known spec" in capsys.readouterr().err
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


def _plot(surfaces: Stored, out: Path) -> int:
    return main(
        [
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
            "--out",
            str(out),
        ]
    )


def test_plot_writes_the_format_its_suffix_names(
    surfaces: Stored, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """PDF and SVG are vector files (no raster image inside), one error band per curve, the same bytes
    each time; PNG stays PNG; the suffix's case does not matter."""
    png, pdf, svg, upper = (tmp_path / n for n in ("c.png", "c.pdf", "c.svg", "C.PDF"))
    for out in (png, pdf, svg, upper):
        assert _plot(surfaces, out) == 0
        assert capsys.readouterr().out.startswith(f"{out}: 2 curve(s)")
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    document = pdf.read_bytes()
    assert document.startswith(b"%PDF-") and upper.read_bytes().startswith(b"%PDF-")
    assert b"/Subtype /Image" not in document
    # Fonts embedded as TrueType (Type 42), not Type 3 bitmaps-in-disguise.
    assert b"/FontFile2" in document and b"/Subtype /Type3" not in document
    tree = ElementTree.parse(svg)
    namespace = "{http://www.w3.org/2000/svg}"
    assert tree.getroot().tag == f"{namespace}svg"
    assert not list(tree.iter(f"{namespace}image"))
    groups = [g.get("id", "") for g in tree.iter(f"{namespace}g")]
    assert (
        sum(g.startswith("FillBetweenPolyCollection") or g.startswith("PolyCollection") for g in groups) == 2
    )
    assert sum(g.startswith("line2d") for g in groups) >= 2
    # Reproducible: the same data writes the same bytes.
    for out in (pdf, svg):
        again = tmp_path / f"again{out.suffix}"
        assert _plot(surfaces, again) == 0
        assert again.read_bytes() == out.read_bytes(), out.suffix
    capsys.readouterr()


def test_plot_refuses_a_suffix_it_cannot_write(
    surfaces: Stored, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("c.jpg", "c", "c.png.txt"):
        out = tmp_path / name
        assert _plot(surfaces, out) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        shown = out.suffix or "no suffix"
        assert (
            line
            == f"evald: --out: {out}: cannot tell the format from {shown!r} (write one of: .png, .pdf, .svg)"
        )
        assert not out.exists()
    # Beside them, a good suffix still plots.
    assert _plot(surfaces, tmp_path / "ok.svg") == 0
