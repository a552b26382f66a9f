"""``evald serve`` on an address other machines reach, without a token: refused unless asked for by name
(``--insecure-no-token`` or ``[web] allow_open = true``); ``evald config check`` warns of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from daemon.web.exposure import is_loopback
from tests.deadlines import Deadline, patient
from tests.harness import evald, free_port, upgraded, write_config, write_dataset


@pytest.fixture
def config(tmp_path: Path) -> Path:
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    upgraded(url).dispose()
    return write_config(tmp_path, url, dataset=write_dataset(tmp_path / "d.jsonl", 2))


def _with_web(config: Path, web: str) -> Path:
    config.write_text(config.read_text() + f"\n[web]\n{web}\n")
    return config


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("eval-box.example.org", False),
    ],
)
def test_loopback_is_this_machine_only(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def _serve_answers(command: list[str], port: int, env: dict[str, str] | None = None) -> str:
    """Start ``evald serve``, wait for its API on loopback, stop it with SIGTERM; its output."""
    process = subprocess.Popen(
        [sys.executable, "-m", "daemon", *command, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        deadline = Deadline(60)
        while True:
            try:
                response = httpx.get(
                    f"http://127.0.0.1:{port}/api/v1/runs",
                    timeout=2,
                    headers={"Authorization": "Bearer t0ken-for-test"},
                )
                assert response.status_code == 200, response.text
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[0][-3000:]
                assert not deadline.expired(), "evald serve did not answer in 60 s"
                time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=patient(30))[0]
    assert process.returncode == 0, output[-3000:]
    return output


def test_serve_on_every_interface_without_a_token_is_refused(config: Path) -> None:
    done = evald("--config", str(config), "serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("evald: web.host: evald serve refused: host '0.0.0.0' is reachable from other")
    assert "[web] token_env" in line and "--insecure-no-token" in line and "allow_open = true" in line


def test_serve_open_when_asked_for_by_name(config: Path) -> None:
    port = free_port()
    output = _serve_answers(
        ["--config", str(config), "serve", "--host", "0.0.0.0", "--insecure-no-token"], port
    )
    assert "web.open_without_token" in output and "web.started" in output


def test_serve_open_by_config_and_with_a_token(config: Path) -> None:

    _with_web(config, "allow_open = true")
    output = _serve_answers(["--config", str(config), "serve", "--host", "0.0.0.0"], free_port())
    assert "web.open_without_token" in output
    # A token makes any address fine: no flag, no warning.
    text = config.read_text().replace("allow_open = true", 'token_env = "EVALD_EXPOSURE_TOKEN"')
    config.write_text(text)
    env = {**os.environ, "EVALD_EXPOSURE_TOKEN": "t0ken-for-test"}
    output = _serve_answers(["--config", str(config), "serve", "--host", "0.0.0.0"], free_port(), env)
    assert "web.open_without_token" not in output and "web.started" in output


def test_config_check_warns_of_an_open_host(config: Path) -> None:
    quiet = evald("config", "check", str(config))
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    _with_web(config, 'host = "0.0.0.0"')
    warned = evald("config", "check", str(config))
    assert warned.returncode == 0, warned.stderr
    assert warned.stdout.startswith(f"{config}: ok")
    (line,) = warned.stderr.strip().splitlines()
    assert line.startswith("evald: warning: web.host: host '0.0.0.0' is reachable from other machines")
    config.write_text(config.read_text() + "allow_open = true\n")
    allowed = evald("config", "check", str(config))
    assert allowed.returncode == 0 and "(allowed by [web] allow_open = true)" in allowed.stderr
