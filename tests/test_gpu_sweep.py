"""The GPU sweep script must run unedited on a GPU node; here its whole path runs on the CPU (gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SUBPROCESS_ENV
from tests.deadlines import patient

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_the_sweep_runs_every_tp_and_reports_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    command = [sys.executable, "-m", "bench.gpu_sweep", "--device", "cpu", "--size", "tiny", "--tp", "1,2"]
    command += ["--prompts", "8", "--batch-size", "4", "--max-new-tokens", "4", "--json", str(out)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=patient(300),
        env=SUBPROCESS_ENV,
        cwd=Path(__file__).parents[1],
    )

    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert [f["tp"] for f in figures] == [1, 2]
    assert all(0 < f["tokens"] <= 8 * 4 and f["seconds"] > 0 and f["load_s"] > 0 for f in figures)
    assert figures[0]["tokens"] == figures[1]["tokens"]  # greedy: the same answers sharded or not
    assert [len(f["peak_bytes"]) for f in figures] == [1, 2]
    header, *rows = done.stdout.strip().splitlines()[-3:]
    assert header.split()[:4] == ["tp", "load", "s", "tokens/s"]
    assert [row.split()[0] for row in rows] == ["1", "2"]
