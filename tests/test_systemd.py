"""The unit files pass systemd's own checker (skipped only where systemd-analyze is absent)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "systemd"
INSTALLED = "/opt/evald/.venv/bin/evald"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("unit", ["evald.service", "evald@.service"])
def test_unit_verifies(unit: str, tmp_path: Path) -> None:
    text = (UNITS / unit).read_text()
    assert "Type=notify" in text and "Restart=on-failure" in text and "WatchdogSec=" in text
    # verify checks that ExecStart exists: point it at this checkout's evald instead of /opt.
    evald = Path(sys.executable).parent / "evald"
    assert evald.exists(), "evald is not installed in this environment"
    name = unit.replace("@.service", "@test.service")
    (tmp_path / name).write_text(text.replace(INSTALLED, str(evald)))
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / name)], capture_output=True, text=True
    )
    problems = [
        line for line in (checked.stdout + checked.stderr).splitlines() if name in line or "evald" in line
    ]
    assert checked.returncode == 0 and problems == [], checked.stdout + checked.stderr
