"""W&B (offline mode) and TensorBoard (live event files) as trackers, read back with their own readers.

No W&B server can run here: the sink runs with ``WANDB_MODE``'s offline mode, and the run's ``.wandb``
file is read back record by record, each decoded by W&B's own protobuf ``Record`` (the file's framing,
W&B's LevelDB-style log, is checked with its CRCs). TensorBoard's event files are read with
TensorBoard's ``EventAccumulator``. Results are stored as the runner stores them and delivered by the
tracker relay's threads, as in tests/test_trackers_mlflow.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy import func, select

from daemon.alerts.lifecycle import Alerter
from daemon.cli import main
from daemon.delivery.relay import Relay
from daemon.delivery.sinks.wandb import _is_missing_run, own_run_id, trainer_run_on_disk
from daemon.delivery.trackers import tracker_routes
from storage import alerting, queries
from storage.models import OutboxMessage, OutboxState
from tests.deadlines import patient
from tests.harness import wait_for
from tests.test_trackers_mlflow import (
    ALERT_ON_ACCURACY,
    RUN,
    Setup,
    _setup,
    delivered,
    metrics_at,
    outbox,
    redeliver,
    store_result,
)

#: W&B's log framing: a 7-byte file header, 32 KiB blocks, each record's header (crc32, length, type).
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B run file"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:
            pos += BLOCK - pos % BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if (crc, length, kind) == (0, 0, 0):
            break
        chunk = data[pos + 7 : pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"bad record at {pos}"
        pos += 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk


def records(run_files: list[Path], kind: str) -> list[Any]:
    """Every record of ``kind`` (``history``, ``alert``, ``summary``, ...) in the run files, in order,
    decoded by W&B's own protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    found = []
    for path in run_files:
        for raw in wandb_records(path):
            record = pb.Record()  # type: ignore[attr-defined]
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == kind:
                found.append(getattr(record, kind))
    return found


def history(run_files: list[Path]) -> list[dict[str, Any]]:
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in row.item}
        for row in records(run_files, "history")
    ]


def expected_values(setup: Setup, *, n: bool = True) -> dict[tuple[str, int], float]:
    with setup.database.session() as s:
        rows = queries.result_rows(s, run=RUN)
    out: dict[tuple[str, int], float] = {}
    for row in rows:
        assert row.step is not None
        base = f"eval/{row.task}" if row.stage == "full" else f"eval/{row.task}/{row.stage}"
        out[(f"{base}/{row.metric}", row.step)] = row.value
        if row.stderr is not None:
            out[(f"{base}/{row.metric}/stderr", row.step)] = row.stderr
        if n and row.n is not None:
            out[(f"{base}/{row.metric}/n", row.step)] = float(row.n)
    return out


def summary_of(files: list[Path]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for update in records(files, "summary"):
        for item in update.update:
            found[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return found


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    for relay in started:
        relay.stop(30)


def _relay(setup: Setup, started: list[Relay]) -> Relay:
    relay = Relay(setup.database, tracker_routes(setup.config.trackers, {})).start()
    started.append(relay)
    setup.alerter._wake = relay.wake
    return relay


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install 'evald[{module}]')")


def _wandb_setup(tmp_path: Path, extra: str = "", after: str = "") -> Setup:
    setup = _setup(
        tmp_path,
        "",
        kind="wandb",
        extra=f'project = "team/grpo"\nmode = "offline"\ndir = "{tmp_path / "wb"}"\n{extra}',
        after=after,
    )
    return setup


def _run_files(tmp_path: Path) -> list[Path]:
    run_id = own_run_id(RUN)
    files = sorted((tmp_path / "wb" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert files, list((tmp_path / "wb").rglob("*.wandb"))
    return files


def test_wandb_offline_every_value_at_its_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relays: list[Relay]
) -> None:
    _needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    setup = _wandb_setup(tmp_path, 'attach = "own"')
    relay = _relay(setup, relays)
    for step in (10, 30, 20):
        store_result(setup, step, metrics_at(step))
    wait_for(lambda: delivered(setup.database, 3), 120, "3 delivered to W&B")
    relay.stop(30)
    # A second daemon start: its sink resumes the run by id; nothing is sent twice.
    redeliver(setup.database)
    relay = _relay(setup, relays)
    store_result(setup, 40, metrics_at(40))
    wait_for(lambda: delivered(setup.database, 4), 120, "4 delivered to W&B")
    relay.stop(30)
    # Each start its own file: W&B names the folder by the second, and the second start came at once.
    assert len(_run_files(tmp_path)) == 2

    def every_step() -> list[dict[str, Any]] | None:
        found = history(_run_files(tmp_path))
        return found if len(found) >= 4 else None

    # W&B's service process writes the run file; `finish` has returned, but the file's last block may
    # land a moment later (the step-40 row was missing from an early read, intermittently).
    rows = wait_for(every_step, 30, "the 4 rows in W&B's run files")
    logged: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        for key, value in row.items():
            numeric = isinstance(value, int | float) and key.startswith("eval/")
            if numeric and key != "eval/step":
                logged.setdefault((key, int(row["eval/step"])), []).append(float(value))
    # One curve per metric and its stderr; n is the summary's (a number per task, not a curve).
    expected = expected_values(setup, n=False)
    assert logged == {k: [v] for k, v in expected.items()}
    assert [int(r["eval/step"]) for r in rows] == [10, 30, 20, 40]
    # W&B's own `_step` goes on across the two starts (offline, W&B would start the resumed run's at 0,
    # and `wandb sync` would drop the second start's rows as going backwards).
    assert [int(r["_step"]) for r in rows] == [0, 1, 2, 3]
    summary = summary_of(_run_files(tmp_path))
    assert summary["eval/arith/accuracy/n"] == 100 and summary["eval/arith/response_length/n"] == 100


#: A trainer that logged 960 rows to its own offline W&B run in the run root (W&B's `_step` 0..959).
TRAINER_960 = """
import sys, wandb
run = wandb.init(project="grpo", dir=sys.argv[1], mode="offline", settings=wandb.Settings(silent=True))
for step in range(960):
    run.log({"train/loss": 1.0 / (step + 1)})
run.finish()
print(run.id)
"""


def test_wandb_offline_rows_are_never_below_the_trainers_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relays: list[Relay]
) -> None:
    """Offline, the trainer's run (found by its latest-run link) is not appended to: W&B would number the
    rows from `_step` 0, and `wandb sync` would drop them below the trainer's 959. An own run takes them,
    each at its checkpoint's step on the `eval/step` axis."""
    _needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    setup = _wandb_setup(tmp_path)  # attach = "trainer", the default
    root = Path(setup.config.runs[0].root)
    root.mkdir(parents=True, exist_ok=True)
    trainer = subprocess.run(
        [sys.executable, "-c", TRAINER_960, str(root)],
        check=True,
        capture_output=True,
        text=True,
        timeout=patient(180),
        env={**os.environ, "WANDB_SILENT": "true"},
    ).stdout.split()[-1]
    assert trainer_run_on_disk(root) == trainer
    (trainer_file,) = root.glob(f"wandb/offline-run-*-{trainer}/run-{trainer}.wandb")
    assert int(history([trainer_file])[-1]["_step"]) == 959
    with structlog.testing.capture_logs() as logs:
        relay = _relay(setup, relays)
        for step in (300, 600, 900):
            store_result(setup, step, metrics_at(step))
        wait_for(lambda: delivered(setup.database, 3), 120, "3 delivered to W&B")
        relay.stop(30)
    said = [e for e in logs if e["event"] == "tracker.wandb_offline_own_run"]
    assert len(said) == 1 and said[0]["trainer_run"] == trainer, logs
    assert not list((tmp_path / "wb").rglob(f"*{trainer}*"))
    rows = wait_for(lambda: history(_run_files(tmp_path)) or None, 30, "the rows in W&B's run file")
    assert [(int(r["eval/step"]), int(r["_step"])) for r in rows] == [(300, 0), (600, 1), (900, 2)]
    assert {r["eval/arith/accuracy"] for r in rows} == {0.3, 0.6, 0.9}
    # The trainer's own file is as the trainer left it.
    assert int(history([trainer_file])[-1]["_step"]) == 959


def test_wandb_attaches_to_the_trainers_latest_run(tmp_path: Path) -> None:
    root = tmp_path / "run"
    folder = root / "wandb" / "run-20261201_101500-abc123xy"
    (folder / "files").mkdir(parents=True)
    (root / "wandb" / "latest-run").symlink_to(folder.name)
    assert trainer_run_on_disk(root) == "abc123xy"
    assert trainer_run_on_disk(tmp_path / "nothing") is None


def test_wandb_tells_a_trainer_run_it_no_longer_has_from_other_refusals() -> None:
    _needs("wandb")
    from wandb.errors import CommError, UsageError

    # W&B's wording for resume="must" and an id it has no run of (as users report it).
    assert _is_missing_run(UsageError("resume='must' but run (1psvaz8q) doesn't exist"))
    assert not _is_missing_run(CommError("HTTP 500: Internal Server Error"))
    assert not _is_missing_run(UsageError("Cannot resume a run while another run is active."))


def test_wandb_a_vanished_trainer_run_falls_back_to_an_own_run_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relays: list[Relay]
) -> None:
    _needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    setup = _wandb_setup(tmp_path)
    # The trainer's W&B folder was deleted; its latest-run link is left pointing at nothing.
    links = Path(setup.config.runs[0].root) / "wandb"
    links.mkdir(parents=True)
    (links / "latest-run").symlink_to("offline-run-20261201_101500-gone1234")
    assert trainer_run_on_disk(links.parent) is None
    with structlog.testing.capture_logs() as logs:
        relay = _relay(setup, relays)
        store_result(setup, 10, metrics_at(10))
        wait_for(lambda: delivered(setup.database, 1), 120, "delivered to W&B")
        relay.stop(30)
    said = [e for e in logs if e["event"] == "tracker.trainer_run_missing"]
    assert len(said) == 1 and said[0]["trainer_run"] == "gone1234", logs
    assert "latest-run" in said[0]["detail"], said
    # Logged into the own run (its id from the run's name), not into one named after the vanished id.
    assert not list((tmp_path / "wb").rglob("*gone1234*"))
    rows = wait_for(lambda: history(_run_files(tmp_path)) or None, 30, "the row in W&B's run file")
    assert [int(r["eval/step"]) for r in rows] == [10]


def test_wandb_backfill_records_stored_alerts_without_alerting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    setup = _wandb_setup(tmp_path, 'attach = "own"', after=ALERT_ON_ACCURACY)
    # Stored before the tracker was configured: the threshold fired at step 10 and resolved at step 100.
    setup.alerter = Alerter(setup.config.model_copy(update={"trackers": ()}))
    for step in (10, 100):
        store_result(setup, step, metrics_at(step))
    export = ["--config", str(setup.config_path), "export", "wandb", "--run", RUN]
    assert main(export) == 0
    said = capsys.readouterr().out
    assert "2 evaluation(s) and 1 alert(s)" in said and "3 sent" in said, said
    assert main(export) == 0
    again = capsys.readouterr().out
    assert "0 sent" in again and "3 already there" in again, again
    with setup.database.session() as s:
        (alert,) = alerting.alert_rows(s, run=RUN)

    summary = wait_for(
        lambda: summary_of(_run_files(tmp_path)).get(f"evald/alerts/{alert.id}"), 30, "the alert's summary"
    )
    assert (summary["state"], summary["step"], summary["rule"]) == ("resolved", 100, "threshold")
    # History, not news: W&B gets no alert (Slack, e-mail) for an event evald stored earlier.
    assert records(_run_files(tmp_path), "alert") == []
    assert [int(r["eval/step"]) for r in history(_run_files(tmp_path))] == [10, 100]


def test_tensorboard_live_event_files_every_value_once(tmp_path: Path, relays: list[Relay]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    logs = tmp_path / "tb"
    setup = _setup(tmp_path, "", kind="tensorboard", extra=f'dir = "{logs}"')
    relay = _relay(setup, relays)
    for step in (20, 10):
        store_result(setup, step, metrics_at(step))
    wait_for(lambda: delivered(setup.database, 2), 60, "2 written as events")
    relay.stop(30)
    redeliver(setup.database)
    relay = _relay(setup, relays)
    wait_for(lambda: delivered(setup.database, 2), 60, "2 delivered again")
    relay.stop(30)
    events = EventAccumulator(str(logs / RUN))
    events.Reload()
    logged = {
        (tag, e.step): [x.value for x in events.Scalars(tag) if x.step == e.step]
        for tag in events.Tags()["scalars"]
        for e in events.Scalars(tag)
    }
    expected = expected_values(setup)
    assert set(logged) == set(expected)
    for key, values in logged.items():
        assert values == pytest.approx([expected[key]]), key
    assert (logs / RUN / "evald-delivered.txt").exists()


def test_the_demo_workspace_takes_trackers_from_trackers_toml(tmp_path: Path) -> None:
    from daemon.config import load_config
    from daemon.demo import write_workspace

    assert load_config(write_workspace(tmp_path / "plain")).trackers == ()
    (tmp_path / "with").mkdir()
    (tmp_path / "with" / "trackers.toml").write_text(
        f'[[trackers]]\nkind = "tensorboard"\ndir = "{tmp_path / "tb"}"\n', encoding="utf-8"
    )
    (tracker,) = load_config(write_workspace(tmp_path / "with")).trackers
    assert tracker.kind == "tensorboard" and tracker.dir == tmp_path / "tb"


def test_wandb_offline_alerts_are_wandb_alerts_and_summary_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relays: list[Relay]
) -> None:
    _needs("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    setup = _wandb_setup(tmp_path, 'attach = "own"', after=ALERT_ON_ACCURACY)
    # Accuracy 0.01 at step 10: the threshold fires; 0.1 at step 100: it resolves. Stored before the
    # relay starts, so all go in one claim: step 100's quick and full values in one row.
    store_result(setup, 10, metrics_at(10))
    store_result(setup, 100, [queries.MetricRow("accuracy", 0.2, 20, 0.1)], stage="quick")
    store_result(setup, 100, metrics_at(100))
    relay = _relay(setup, relays)
    wait_for(lambda: outbox(setup.database).get("pending", 0) == 0 or None, 120, "all sent to W&B")
    relay.stop(30)
    with setup.database.session() as s:
        rows = alerting.alert_rows(s, run=RUN)
        (threshold,) = [a for a in rows if a.rule == "threshold"]
        events = int(
            s.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(
                    OutboxMessage.event_id.startswith("trka_"), OutboxMessage.state == OutboxState.DELIVERED
                )
            )
            or 0
        )
    files = _run_files(tmp_path)

    def written() -> list[tuple[str, str]] | None:
        # W&B's own process writes the run file: on a loaded machine it lands after the relay stops.
        found = [(a.title, a.level) for a in records(files, "alert")]
        return found if len(found) >= events else None

    # W&B's own alert records (what W&B sends to Slack or e-mail online): one per event, once each.
    alerts = wait_for(written, 60, "W&B's alert records in the run file")
    assert len(alerts) == events >= 2, alerts
    assert (f"evald {RUN}: threshold on arith/accuracy at step 10 (firing)", "ERROR") in alerts
    assert (f"evald {RUN}: threshold on arith/accuracy at step 100 (resolved)", "INFO") in alerts
    # The summary keeps each alert's latest event, as evald has it.
    summary: dict[str, Any] = {}
    for update in records(files, "summary"):
        for item in update.update:
            summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    for row in rows:
        assert summary[f"evald/alerts/{row.id}"]["state"] == row.state, row
    assert summary[f"evald/alerts/{threshold.id}"]["step"] == 100
    # And the values, once each, one row per step (W&B: one log per step).
    rows_logged = history(files)
    assert [int(r["eval/step"]) for r in rows_logged] == [10, 100]
    assert rows_logged[1]["eval/arith/quick/accuracy"] == 0.2
    assert rows_logged[1]["eval/arith/accuracy"] == metrics_at(100)[0].value
