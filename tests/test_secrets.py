"""The daemon's secrets stay the daemon's: no worker inherits them, and no output of a full run shows them.

A full run here is a real daemon on PostgreSQL whose URL carries a password (the server trusts loopback,
so any password works) and a signed webhook whose receiver verifies every alert, with a threshold every
result crosses so the alert path runs too.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import psutil
import pytest
from sqlalchemy.engine import make_url

from daemon.config import Secret, load_config
from daemon.delivery.receiver import WebhookReceiver
from daemon.running.environment import worker_environment
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    evald,
    upgraded,
    wait_for,
    worker_processes,
    write_config,
    write_dataset,
)

PASSWORD = "pw-5d41402abc4b2a76b9719d911017c592"
SECRET = Secret.generate()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_worker_environment_leaves_out_every_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    config_path = write_config(tmp_path, "sqlite:///x.db", dataset=data)
    with config_path.open("a") as extra:
        extra.write(
            '[[webhooks]]\nname = "oncall"\nurl = "http://127.0.0.1:9/hook"\nsecret_env = "HOOK_SECRET"\n'
        )
    monkeypatch.setenv("HOOK_SECRET", "whsec_visible")
    monkeypatch.setenv("EVALD_DATABASE_URL", f"postgresql://u:{PASSWORD}@db/evald")
    monkeypatch.setenv("EVALD_WEB_TOKEN_ENV", "X")
    monkeypatch.setenv("HF_HOME", "/cache/hf")
    env = worker_environment(load_config(config_path))
    assert "HOOK_SECRET" not in env and "EVALD_DATABASE_URL" not in env
    assert not any(PASSWORD in value or "whsec_visible" in value for value in env.values())
    # What a worker does need is still there.
    assert env["HF_HOME"] == "/cache/hf" and env["PATH"] == os.environ["PATH"]
    assert "EVALD_PARENT_PID" in env


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.postgres
def test_no_secret_reaches_a_worker_a_log_a_file_or_the_cli(
    postgres_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    url = make_url(postgres_url).set(password=PASSWORD).render_as_string(hide_password=False)
    upgraded(url).dispose()
    data = write_dataset(tmp_path / "arith.jsonl", 12)
    port = _free_port()
    config = write_config(tmp_path, "sqlite:///unused.db", dataset=data, batch_size=2)
    with config.open("a") as extra:
        extra.write(
            f'\n[alerts]\ncooldown_secs = 0\nfeedback_dir = "{tmp_path / "feedback"}"\n'
            "[alerts.thresholds.wall_s]\nmin = 1000000\n"
            f'[[webhooks]]\nname = "oncall"\nurl = "http://127.0.0.1:{port}/hook"\n'
            'secret_env = "EVALD_TEST_HOOK_SECRET"\ntimeout_secs = 1.0\n'
        )
    env = {"EVALD_DATABASE_URL": url, "EVALD_TEST_HOOK_SECRET": SECRET.reveal_text()}
    secrets = [PASSWORD, SECRET.reveal_text(), SECRET.reveal_text().removeprefix("whsec_")]
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    outputs: list[str] = []
    with WebhookReceiver(SECRET, port=port) as receiver:
        daemon = DaemonProcess(config, tmp_path / "daemon.log", env)
        try:
            daemon.wait_ready()
            workers = wait_for(
                lambda: [p for p in worker_processes(tmp_path / "state") if _environ(p)] or None,
                120,
                "a running worker",
                daemon.process,
            )
            for worker in workers:
                environ = _environ(worker)
                assert "PATH=" in environ  # the environment was read
                assert not any(s in environ for s in secrets), f"pid {worker.pid} inherited a secret"
            database = upgraded(url)
            wait_for(lambda: all_jobs_done(database, 1), 240, "the job", daemon.process)
            database.dispose()
            assert receiver.wait_for(1, timeout=60)  # the signed alert went out and was verified
            for args in (
                ("status",),
                ("status", "--format", "json"),
                ("results", "--format", "json"),
                ("alerts",),
                ("alerts", "--format", "json"),
                ("history", "1"),
                ("webhook", "test", "oncall"),
            ):
                done = evald("--config", str(config), *args, env=env)
                outputs.append(done.stdout + done.stderr)
            bad = evald(
                "--config",
                str(config),
                "results",
                env={**env, "EVALD_DATABASE_URL": url.replace("5432", "1")},
            )
            assert bad.returncode == 1
            outputs.append(bad.stdout + bad.stderr)
            assert daemon.stop() == 0
        finally:
            if daemon.process.poll() is None:
                daemon.process.kill()
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000]
    assert any(p.name == "daemon.log" for p in files) and any(p.parent.name == "feedback" for p in files)
    for path in files:
        content = path.read_bytes().decode("utf-8", "replace")
        leaked = [s for s in secrets if s in content]
        assert not leaked, f"{path} shows a secret"
    for output in outputs:
        assert not any(s in output for s in secrets), output


def _environ(process: psutil.Process) -> str:
    try:
        return "\n".join(f"{k}={v}" for k, v in process.environ().items())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""
