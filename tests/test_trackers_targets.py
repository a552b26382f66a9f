"""Deliveries are kept by target: a tracker pointed at another experiment (or TensorBoard folder) sends its
runs' whole history there, once, and pointed back sends only what the first one lacks; nothing doubled in
either. Against the real ``mlflow server`` (tests/mlflowserver.py) and TensorBoard's own reader."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog

from daemon.alerts.lifecycle import Alerter
from daemon.cli import main
from daemon.config import load_config
from daemon.delivery.relay import Relay
from daemon.delivery.trackers import tracker_routes
from storage import alerting
from tests.harness import wait_for
from tests.mlflowserver import MlflowServer, mlflow_server_fixture
from tests.test_trackers_mlflow import (
    ALERT_ON_ACCURACY,
    RUN,
    Setup,
    _setup,
    alert_files,
    assert_equal_to_results,
    evaluation_files,
    metrics_at,
    outbox,
    store_result,
)

mlflow_server = mlflow_server_fixture()


def pointed(setup: Setup, old: str, new: str, **changes: Any) -> Setup:
    """The config file edited (``old`` -> ``new``) and loaded again, as a reload does; the alerter (which
    queues live results) built from it."""
    text = setup.config_path.read_text(encoding="utf-8")
    assert old in text
    setup.config_path.write_text(text.replace(old, new), encoding="utf-8")
    config = load_config(setup.config_path)
    return replace(setup, config=config, alerter=Alerter(config), **changes)


def start(setup: Setup, relays: list[Relay]) -> Relay:
    relay = Relay(setup.database, tracker_routes(setup.config.trackers, {})).start()
    relays.append(relay)
    setup.alerter._wake = relay.wake
    return relay


@pytest.fixture
def relays() -> Any:
    started: list[Relay] = []
    yield started
    for relay in started:
        relay.stop()


def settled(setup: Setup) -> bool | None:
    return outbox(setup.database).get("pending", 0) == 0 or None


def test_a_changed_experiment_gets_the_whole_history_once_and_pointed_back_nothing_twice(
    tmp_path: Path,
    mlflow_server: MlflowServer,
    relays: list[Relay],
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = _setup(
        tmp_path, mlflow_server.uri, extra='attach = "own"', after=ALERT_ON_ACCURACY, experiment="exp-a"
    )
    relay = start(first, relays)
    # Accuracy 0.01 at step 10 fires the threshold (an alert event besides the two evaluations).
    for step in (10, 20):
        store_result(first, step, metrics_at(step))
    wait_for(lambda: settled(first), 60, "sent to exp-a")
    relay.stop()
    assert outbox(first.database) == {"delivered": 3}

    # Pointed at another experiment with the daemon down: the backfill sends everything there, rather
    # than counting it as already delivered.
    second = pointed(first, 'experiment = "exp-a"', 'experiment = "exp-b"', experiment="exp-b")
    assert second.config.trackers[0].target != first.config.trackers[0].target
    assert main(["--config", str(second.config_path), "export", "mlflow", "--run", RUN]) == 0
    said = capsys.readouterr().out
    assert "2 evaluation(s) and 1 alert(s)" in said and "3 sent" in said and "0 already there" in said, said
    assert assert_equal_to_results(second) == 4

    # The daemon started with it: a new result goes to exp-b only.
    start(second, relays)
    store_result(second, 30, metrics_at(30))
    wait_for(lambda: settled(second), 60, "step 30 sent to exp-b")
    assert assert_equal_to_results(second) == 6
    assert sorted(f["step"] for f in evaluation_files(second)) == [10, 20, 30]

    # Pointed back (a reload): exp-a gets what it lacks (step 30), and nothing it has again.
    for relay in relays:
        relay.stop()
    back = pointed(second, 'experiment = "exp-b"', 'experiment = "exp-a"', experiment="exp-a")
    with structlog.testing.capture_logs() as logs:
        start(back, relays)
        # Each target's messages once: 3 + 1 (exp-a), 3 + 1 (exp-b).
        wait_for(lambda: outbox(back.database) == {"delivered": 8} or None, 60, "exp-a caught up")
    (changed,) = [e for e in logs if e["event"] == "tracker.target_changed"]
    assert changed["queued"] == 1 and "exp-a" in changed["target"], changed
    assert assert_equal_to_results(back) == 6
    assert sorted(f["step"] for f in evaluation_files(back)) == [10, 20, 30]
    with back.database.session() as s:
        (alert,) = alerting.alert_rows(s, run=RUN)
    assert alert_files(back)[alert.id]["state"] == "firing"


def test_a_changed_tensorboard_folder_gets_the_history(tmp_path: Path, relays: list[Relay]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    first = _setup(tmp_path, "", kind="tensorboard", extra=f'dir = "{tmp_path / "tb-a"}"')
    relay = start(first, relays)
    for step in (10, 20):
        store_result(first, step, metrics_at(step))
    wait_for(lambda: settled(first), 60, "written to tb-a")
    relay.stop()
    second = pointed(first, str(tmp_path / "tb-a"), str(tmp_path / "tb-b"))
    relay = start(second, relays)
    store_result(second, 30, metrics_at(30))
    wait_for(lambda: outbox(second.database) == {"delivered": 5} or None, 60, "all in tb-b")
    relay.stop()

    def steps(folder: Path) -> list[int]:
        events = EventAccumulator(str(folder / RUN))
        events.Reload()
        return [e.step for e in events.Scalars("eval/arith/accuracy")]

    assert steps(tmp_path / "tb-a") == [10, 20]
    assert sorted(steps(tmp_path / "tb-b")) == [10, 20, 30]
