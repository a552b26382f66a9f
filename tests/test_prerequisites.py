"""tests/prerequisites.sh, which ``make test`` runs first: a missing Chromium is installed from Debian's
packages where it can be (root with apt-get), else ``make test`` stops naming the one command to run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deadlines import patient

SCRIPT = Path(__file__).with_name("prerequisites.sh")


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    calls = tmp_path / "apt-get.calls"
    fake = tmp_path / "apt-get"
    # Records what it was asked and installs nothing: the browser stays missing.
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=patient(60),
        env={**os.environ, "EVALD_APT_GET": str(fake), **env},
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_a_missing_chromium_is_installed_as_root_and_else_named_with_the_command(tmp_path: Path) -> None:
    missing = tmp_path / "no-such" / "chromium"
    done, calls = _run(tmp_path, EVALD_CHROMIUM=str(missing))
    assert done.returncode == 1, done.stdout + done.stderr
    if os.geteuid() == 0:
        assert calls == ["update -qq", "install -y -qq chromium"]
        assert f"no Chromium at {missing}; installing Debian's chromium" in done.stdout
    else:
        assert calls == []
    # Still missing after the install (the stand-in installs nothing): stopped, the browser named.
    assert (
        f"no Chromium at EVALD_CHROMIUM={missing}" in done.stderr
        or f"no Chromium at {missing}" in done.stderr
    )
    assert "run this, then make test again:" in done.stderr


def test_a_present_chromium_is_left_alone(tmp_path: Path) -> None:
    present = tmp_path / "chromium"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)
    done, calls = _run(
        tmp_path,
        EVALD_CHROMIUM=str(present),
        EVALD_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:1/postgres",
    )
    assert calls == []
    # The PostgreSQL check comes next: a server named by the user that does not answer stops it, named.
    assert done.returncode == 1
    assert (
        "PostgreSQL is not answering at EVALD_TEST_POSTGRES_URL=postgresql://postgres@127.0.0.1:1/postgres"
        in done.stderr
    )
    assert "unset EVALD_TEST_POSTGRES_URL" in done.stderr
    assert "Chromium" not in done.stderr


def test_everything_present_passes_quietly(tmp_path: Path) -> None:
    if os.environ.get("EVALD_REQUIRE_POSTGRES") != "1":
        pytest.skip("needs the PostgreSQL server that make test requires (EVALD_REQUIRE_POSTGRES=1)")
    present = tmp_path / "chromium"
    present.write_text("#!/bin/sh\n")
    present.chmod(0o755)
    done, calls = _run(tmp_path, EVALD_CHROMIUM=str(present))
    assert (done.returncode, done.stderr, calls) == (0, "", [])
