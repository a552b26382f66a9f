"""A tracker paused by refused credentials resumes at once when they are fixed (issue 45): the credential's
variable pointed elsewhere and the config reloaded with SIGHUP, or the daemon restarted with the variable
set. Not after ``pause_secs`` (an hour here), which the stored back-off of the first refused message kept
before, with the run's later messages queued behind it.

A live ``evald run`` (no checkpoints on disk: the results are stored by the test the way the runner stores
them, which queues the tracker's messages) sends to a real ``mlflow server`` (tests/mlflowserver.py): the
shared plain one for an unset token, and, marked long, the basic-auth one for a wrong password. ``evald
status`` is read before (paused, why, the try an hour away) and after (up to date).
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from daemon.cli import main
from daemon.delivery.trackers import CHANGED, STARTED
from tests.harness import DaemonProcess, log_events, wait_for
from tests.mlflowserver import (
    ADMIN,
    MlflowServer,
    mlflow_auth_server_fixture,
    mlflow_server_fixture,
)
from tests.test_trackers_mlflow import (
    Setup,
    _setup,
    admin_env,
    assert_equal_to_results,
    delivered,
    metrics_at,
    store_result,
)

mlflow_server = mlflow_server_fixture()
mlflow_auth_server = mlflow_auth_server_fixture()

pytestmark = pytest.mark.slow

#: Far longer than any wait below: a delivery seen at all was not the pause running out.
PAUSE_S = 3600
#: The basic-auth server hashes the password at every request: seconds a call on two busy cores.
DEADLINE_S = 240.0


def _status(setup: Setup, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    capsys.readouterr()
    assert main(["--config", str(setup.config_path), "status", *extra]) == 0
    return capsys.readouterr().out


def _paused_until_reload(
    setup: Setup,
    daemon: DaemonProcess,
    capsys: pytest.CaptureFixture[str],
    *,
    refusal: str,
    fix: tuple[str, str],
) -> None:
    """Two results stored while the tracker is refused: paused with one line, the status saying so and
    when it tries next (an hour away, not "now" for the result queued behind); then ``fix`` (the config's
    text before and after) and SIGHUP: both delivered well before the pause would have ended."""
    log = daemon.log
    store_result(setup, 10, metrics_at(10))
    (paused,) = wait_for(
        lambda: log_events(log, "tracker.paused") or None, DEADLINE_S, "paused", daemon.process
    )
    assert refusal in paused["error"], paused
    store_result(setup, 20, metrics_at(20))
    (shown,) = json.loads(_status(setup, capsys, "--format", "json"))["trackers"]
    assert (shown["state"], shown["pending"], shown["attempts"]) == ("paused", 2, 1), shown
    assert refusal in shown["last_error"] and not shown["last_error"].startswith("paused: ")
    assert PAUSE_S - 300 < shown["next_attempt_in_s"] <= PAUSE_S, shown
    text = _status(setup, capsys)
    assert re.search(
        r"  mlflow \(mlflow\): PAUSED \(credentials refused\): 2 pending, oldest .* old; "
        r"tried 1 time\(s\), next try in (59m \d\ds|1h 00m)\n",
        text,
    ), text
    assert "next try now" not in text

    before, after = fix
    config = setup.config_path.read_text()
    assert before in config
    setup.config_path.write_text(config.replace(before, after))
    daemon.process.send_signal(signal.SIGHUP)
    wait_for(lambda: log_events(log, "config.reloaded") or None, 60, "config.reloaded", daemon.process)
    wait_for(
        lambda: delivered(setup.database, 2), DEADLINE_S, "both delivered after the reload", daemon.process
    )
    # Its waiting messages were made due by the reload, saying why, and delivered together.
    resumed = [e for e in log_events(log, "tracker.retry_now") if e["reason"] == CHANGED]
    assert [e["messages"] for e in resumed] == [1], resumed
    # Logged once the delivery is stored: waited for, as the database may show it first.
    sent = wait_for(lambda: log_events(log, "tracker.delivered") or None, 30, "delivered", daemon.process)
    assert [e["messages"] for e in sent] == [2]
    assert re.search(r"  mlflow \(mlflow\): up to date, 2 delivered", _status(setup, capsys))


def test_an_unset_token_fixed_by_a_reload_or_a_restart_is_delivered_at_once(
    tmp_path: Path, mlflow_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    unset = 'token_env = "EVALD_T_UNSET"'
    setup = _setup(
        tmp_path,
        mlflow_server.uri,
        extra=f'attach = "own"\n{unset}\npause_secs = {PAUSE_S}',
    )
    env = {"EVALD_T_TOKEN": "any-token"}
    daemon = DaemonProcess(setup.config_path, tmp_path / "daemon.log", env)
    try:
        daemon.wait_ready()
        fixed = 'token_env = "EVALD_T_TOKEN"'
        _paused_until_reload(
            setup, daemon, capsys, refusal="EVALD_T_UNSET is not set or empty", fix=(unset, fixed)
        )
        # Pointed back at the unset variable: the next result pauses the tracker again. Then the daemon
        # restarted with the variable set (as after a fix to its environment file): delivered at once.
        setup.config_path.write_text(setup.config_path.read_text().replace(fixed, unset))
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(
            lambda: len(log_events(daemon.log, "config.reloaded")) == 2 or None,
            60,
            "reloaded",
            daemon.process,
        )
        store_result(setup, 30, metrics_at(30))
        wait_for(
            lambda: len(log_events(daemon.log, "tracker.paused")) == 2 or None, DEADLINE_S, "paused again"
        )
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
    log = tmp_path / "restarted.log"
    daemon = DaemonProcess(setup.config_path, log, {**env, "EVALD_T_UNSET": "any-token"})
    try:
        daemon.wait_ready()
        wait_for(
            lambda: delivered(setup.database, 3), DEADLINE_S, "delivered after the restart", daemon.process
        )
        assert [e["messages"] for e in log_events(log, "tracker.retry_now") if e["reason"] == STARTED] == [1]
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
    assert assert_equal_to_results(setup) == 6


@pytest.mark.long
def test_a_wrong_password_fixed_by_a_reload_is_delivered_at_once(
    tmp_path: Path, mlflow_auth_server: MlflowServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: a basic-auth server, the wrong password (paused), ``token_env`` corrected and
    SIGHUP: delivered then, not ``pause_secs`` later."""
    wrong = 'token_env = "EVALD_T_WRONG"'
    setup = _setup(
        tmp_path,
        mlflow_auth_server.uri,
        extra=f'attach = "own"\nuser_env = "EVALD_T_USER"\n{wrong}\npause_secs = {PAUSE_S}',
        timeout_secs=60,
    )
    env = {"EVALD_T_USER": ADMIN[0], "EVALD_T_WRONG": "wrong", "EVALD_T_PASS": ADMIN[1]}
    daemon = DaemonProcess(setup.config_path, tmp_path / "daemon.log", env)
    try:
        daemon.wait_ready()
        _paused_until_reload(
            setup,
            daemon,
            capsys,
            refusal="credentials refused (HTTP 401)",
            fix=(wrong, 'token_env = "EVALD_T_PASS"'),
        )
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.process.kill()
            daemon.process.wait()
    with admin_env(mlflow_auth_server.uri):
        assert assert_equal_to_results(setup) == 4
