"""Alerts end to end below the daemon: stored results → detectors → alerts and outbox in one transaction →
the relay → a real signed-webhook receiver on loopback (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import math
import socket
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from daemon.alerts.lifecycle import Alerter
from daemon.cli import main
from daemon.config import Config, Secret, parse_config
from daemon.delivery.backoff import backoff, retry_after
from daemon.delivery.receiver import WebhookReceiver
from daemon.delivery.relay import Relay
from daemon.delivery.sinks.webhook import Endpoint
from daemon.errors import ConfigError
from storage import alerting, migrations, queries
from storage.database import Database
from storage.models import CheckpointState, utcnow
from storage.outbox import disable_endpoint, disabled
from tests import oldrows
from tests.deadlines import Deadline
from tests.harness import wait_for

SECRET = Secret.parse("whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
PLATEAU = [0.30, 0.45, 0.55, 0.60, 0.61, 0.60, 0.62, 0.61, 0.60, 0.61]


def config_text(
    tmp_path: Path,
    *,
    webhooks: Sequence[str] = ("hook",),
    cooldown: float = 3600,
    url: str = "http://127.0.0.1:9/hook",
) -> str:
    (tmp_path / "d.jsonl").write_text('{"problem": "1+1", "answer": "2"}\n')
    hooks = "".join(
        f'[[webhooks]]\nname = "{name}"\nurl = "{url}"\ntimeout_secs = 1.0\n'
        f'max_backoff_secs = 0.5\nsecret_env = "EVALD_TEST_SECRET"\n'
        for name in webhooks
    )
    return f"""
[[runs]]
name = "grpo"
root = "{tmp_path / "run"}"

[[tasks]]
name = "math"
dataset = "d.jsonl"

[alerts]
cooldown_secs = {cooldown}
feedback_dir = "feedback"
links = {{ dashboard = "https://grafana.example/d/evald" }}

{hooks}
"""


def make_config(tmp_path: Path, *, webhooks: Sequence[str] = ("hook",), cooldown: float = 3600) -> Config:
    text = config_text(tmp_path, webhooks=webhooks, cooldown=cooldown)
    return parse_config(tomllib.loads(text), base_dir=tmp_path, source="test", environ={})


def store(db: Database, config: Config, alerter: Alerter, step: int, accuracy: float, n: int = 500) -> None:
    """One checkpoint of run ``grpo`` evaluated on ``math``: its accuracy stored, then its alerts."""
    with db.session() as s:
        run_id = queries.ensure_run(s, "grpo", str(config.runs[0].root))
        checkpoint_id = queries.record_checkpoint(
            s,
            run_id=run_id,
            path=f"/runs/grpo/step_{step}",
            name=f"step_{step}",
            step=step,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint_id, step=step, tasks=("math",))
    with db.session() as s:
        job = queries.claim_next_job(s, "test:1")
        assert job is not None and job.step == step
    stderr = math.sqrt(max(accuracy * (1 - accuracy), 0.01) / n)
    with db.session() as s:
        assert queries.complete_job(
            s,
            job_id=job.id,
            owner="test:1",
            metrics=[queries.MetricRow("accuracy", accuracy, n, stderr)],
            samples=[],
            duration_s=1.0,
            load_s=None,
        )
        alerter.after_result(s, job)
    alerter.after_commit()


def outbox(db: Database) -> list[tuple[str, str, str]]:
    """(endpoint, state, alert state in the body) of every outbox row, in order."""
    from sqlalchemy import select

    from storage.models import OutboxMessage

    with db.session() as s:
        rows = s.scalars(select(OutboxMessage).order_by(OutboxMessage.id)).all()
        return [(r.endpoint, r.state.value, json.loads(r.body)["state"]) for r in rows]


def test_a_cliff_fires_once_repeats_quietly_and_resolves(database: Database, tmp_path: Path) -> None:
    config = make_config(tmp_path, webhooks=("hook", "slack"))
    woken: list[int] = []
    alerter = Alerter(config, wake=lambda: woken.append(1))
    for i, value in enumerate(PLATEAU):
        store(database, config, alerter, (i + 1) * 100, value)
    assert outbox(database) == []

    store(database, config, alerter, 1100, 0.35)
    with database.session() as s:
        [alert] = [a for a in alerting.alert_rows(s) if a.rule == "drop_from_best"]
    assert (alert.state, alert.metric, alert.step, alert.severity) == ("firing", "accuracy", 1100, "critical")
    assert alert.best_step is not None and alert.rollback_step == 1000
    fired = outbox(database)
    assert ("hook", "pending", "firing") in fired and ("slack", "pending", "firing") in fired
    # The status file a trainer polls, written after the commit.
    status = json.loads((tmp_path / "feedback" / "grpo.json").read_text())
    assert status["rollback_step"] == 1000 and status["best"]["metric"] == "accuracy"
    assert {f["rule"] for f in status["firing"]} >= {"drop_from_best"}

    # Still down at the next checkpoint: the same alert, updated, not sent again within the cooldown.
    store(database, config, alerter, 1200, 0.34)
    with database.session() as s:
        again = [a for a in alerting.alert_rows(s) if a.rule == "drop_from_best"]
    # The onset stays where the cliff was (where a person rolls back from); the latest step moves on.
    assert len(again) == 1 and again[0].repeats == 2
    assert (again[0].step, again[0].first_step, again[0].last_step) == (1100, 1100, 1200)
    assert len(outbox(database)) == len(fired)

    # Recovered: every firing alert of the run resolves, and the resolution is sent.
    for step in (1300, 1400):
        store(database, config, alerter, step, 0.61)
    with database.session() as s:
        rows = alerting.alert_rows(s)
    assert {a.state for a in rows} == {"resolved"}
    [drop] = [a for a in rows if a.rule == "drop_from_best"]
    assert (drop.first_step, drop.last_step, drop.resolved_step) == (1100, 1200, drop.resolved_step)
    assert drop.resolved_step in (1300, 1400)
    resolved = [row for row in outbox(database) if row[2] == "resolved"]
    assert len(resolved) == len(fired)
    assert woken


def test_after_the_cooldown_a_firing_alert_is_sent_again(database: Database, tmp_path: Path) -> None:
    config = make_config(tmp_path, cooldown=0)
    alerter = Alerter(config)
    for i, value in enumerate(PLATEAU):
        store(database, config, alerter, (i + 1) * 100, value)
    store(database, config, alerter, 1100, 0.35)
    first = len(outbox(database))
    store(database, config, alerter, 1200, 0.34)

    assert len(outbox(database)) > first


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def relay_config(tmp_path: Path) -> Iterator[tuple[Config, int]]:
    port = free_port()
    config = make_config(tmp_path)
    hook = config.webhooks[0].model_copy(update={"url": f"http://127.0.0.1:{port}/hook"})
    yield config.model_copy(update={"webhooks": (hook,)}), port


def fire_cliffs(database: Database, config: Config, alerter: Alerter, count: int) -> None:
    """``count`` alternating cliffs and recoveries: 2 × count notifications, in order."""
    for i, value in enumerate(PLATEAU):
        store(database, config, alerter, (i + 1) * 100, value)
    step = 1100
    for _ in range(count):
        store(database, config, alerter, step, 0.30)
        store(database, config, alerter, step + 100, 0.61)
        store(database, config, alerter, step + 200, 0.61)
        step += 300


def test_receiver_down_then_up_gets_every_alert_once_in_order(
    database: Database, relay_config: tuple[Config, int]
) -> None:
    config, port = relay_config
    relay = Relay(database, [Endpoint(config.webhooks[0], SECRET)]).start()
    try:
        fire_cliffs(database, config, Alerter(config, wake=relay.wake), 2)
        queued = [row for row in outbox(database)]
        assert len(queued) >= 4
        # Nobody listens: the relay keeps retrying (two tries recorded, not a fixed wait).
        wait_for(lambda: len(history(database)) >= 2 or None, 15, "the relay to retry while nobody listens")
        with WebhookReceiver(SECRET, port=port) as receiver:
            delivered = receiver.wait_for(len(queued), timeout=15)
            assert all(a.error is None for a in receiver.attempts)
        ids = [a.webhook_id for a in delivered]
        assert len(set(ids)) == len(ids) == len(queued)
        states = [json.loads(a.body)["state"] for a in delivered]
        assert states == [q[2] for q in queued]
        # The receiver has the last one before the relay records it delivered.
        wait_for(
            lambda: {row[1] for row in outbox(database)} == {"delivered"} or None,
            15,
            "every one recorded sent",
        )
        with database.session() as s:
            assert all(r.delivered == r.queued > 0 for r in alerting.alert_rows(s))
    finally:
        relay.stop()


def history(database: Database) -> list[tuple[int | None, str | None]]:
    from sqlalchemy import select

    from storage.models import Delivery

    with database.session() as s:
        return [(d.status_code, d.error) for d in s.scalars(select(Delivery).order_by(Delivery.id))]


def test_a_hanging_receiver_is_cut_off_by_the_timeout(
    database: Database, relay_config: tuple[Config, int]
) -> None:
    config, port = relay_config
    with WebhookReceiver(SECRET, port=port) as receiver:
        receiver.hang(3.0)
        relay = Relay(database, [Endpoint(config.webhooks[0], SECRET)]).start()
        try:
            fire_cliffs(database, config, Alerter(config, wake=relay.wake), 1)
            receiver.wait_for(len(outbox(database)), timeout=20)
        finally:
            relay.stop()
    tries = history(database)
    # Cut off after the 1 s timeout (the receiver would have held it for 3 s), then sent again.
    assert tries[0] == (None, "no answer within 1 s")
    assert (200, None) in tries[1:]
    assert {row[1] for row in outbox(database)} == {"delivered"}


def test_a_500_is_retried_after_a_backoff(database: Database, relay_config: tuple[Config, int]) -> None:
    config, port = relay_config
    with WebhookReceiver(SECRET, port=port) as receiver:
        receiver.respond(500)
        receiver.respond(503, retry_after="1")
        relay = Relay(database, [Endpoint(config.webhooks[0], SECRET)]).start()
        try:
            fire_cliffs(database, config, Alerter(config, wake=relay.wake), 1)
            [first, *_] = receiver.wait_for(len(outbox(database)), timeout=20)
        finally:
            relay.stop()
        attempts = receiver.attempts
    assert [a.status for a in attempts[:3]] == [500, 503, 200]
    assert attempts[0].webhook_id == attempts[1].webhook_id == attempts[2].webhook_id
    # Retry-After: 1 was honoured over the shorter backoff.
    assert attempts[2].received_at - attempts[1].received_at >= 0.95
    assert [code for code, _ in history(database)[:3]] == [500, 503, 200]
    assert json.loads(first.body)["type"] == "evald.alert"


def test_410_disables_the_endpoint(database: Database, relay_config: tuple[Config, int]) -> None:
    config, port = relay_config
    with WebhookReceiver(SECRET, port=port) as receiver:
        receiver.respond(410, times=10)
        relay = Relay(database, [Endpoint(config.webhooks[0], SECRET)]).start()
        try:
            fire_cliffs(database, config, Alerter(config, wake=relay.wake), 2)
            deadline = Deadline(10)
            while not deadline.expired() and {row[1] for row in outbox(database)} != {"disabled"}:
                time.sleep(0.1)
        finally:
            relay.stop()
        assert len(receiver.attempts) == 1
    assert {row[1] for row in outbox(database)} == {"disabled"}
    with database.session() as s:
        assert disabled(s, "hook") is not None


def test_an_alert_stored_before_a_crash_is_sent_after_the_restart(
    database: Database, relay_config: tuple[Config, int]
) -> None:
    config, port = relay_config
    # No relay: the daemon died right after the commit that stored the alert and its outbox rows.
    fire_cliffs(database, config, Alerter(config), 1)
    pending = outbox(database)
    assert pending and {row[1] for row in pending} == {"pending"}

    with WebhookReceiver(SECRET, port=port) as receiver:
        relay = Relay(database, [Endpoint(config.webhooks[0], SECRET)]).start()
        try:
            delivered = receiver.wait_for(len(pending), timeout=15)
        finally:
            relay.stop()
    assert len(delivered) == len(pending)


def test_backoff_and_retry_after() -> None:
    import random

    rng = random.Random(1)
    waits = [backoff(n, 60.0, rng) for n in range(1, 9)]

    assert all(2 ** (n - 1) / 2 <= w <= 2 ** (n - 1) for n, w in zip(range(1, 7), waits, strict=False))
    assert max(waits) <= 60.0
    now = utcnow()
    assert retry_after("7", now) == 7.0
    assert retry_after(None, now) is None and retry_after("soon", now) is None
    from datetime import timedelta
    from email.utils import format_datetime

    assert retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now) == pytest.approx(
        30, abs=1
    )


@dataclass(frozen=True)
class Place:
    run_id: int
    run: str
    task: str
    step: int | None


def test_a_failed_evaluation_alerts_until_the_task_stores_a_result(
    database: Database, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    alerter = Alerter(config)
    store(database, config, alerter, 100, 0.5)
    with database.session() as s:
        run_id = queries.ensure_run(s, "grpo", str(config.runs[0].root))
        for _ in range(2):
            alerter.operational(
                s,
                Place(run_id, "grpo", "math", 200),
                rule="eval_failed",
                severity="warning",
                message="job 2 (math/full at step 200) failed after 3 attempt(s): crash: rank 1 failed",
            )
    with database.session() as s:
        [alert] = alerting.alert_rows(s)
    assert (alert.rule, alert.state, alert.step, alert.metric, alert.repeats) == (
        "eval_failed",
        "firing",
        200,
        None,
        2,
    )
    assert alert.value is None
    assert outbox(database) == [("hook", "pending", "firing")]

    store(database, config, alerter, 300, 0.5)

    with database.session() as s:
        [alert] = alerting.alert_rows(s)
    assert alert.state == "resolved" and "cleared" in alert.message
    assert outbox(database)[-1] == ("hook", "pending", "resolved")


def test_evald_alerts_lists_them_as_a_user_reads_them(
    database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path)
    alerter = Alerter(config)
    for i, value in enumerate([*PLATEAU, 0.35]):
        store(database, config, alerter, (i + 1) * 100, value)
    path = tmp_path / "evald.toml"
    path.write_text(config_text(tmp_path) + f'\n[database]\nurl = "{database.url}"\n')
    capsys.readouterr()

    assert main(["--config", str(path), "alerts", "--format", "json", "--state", "firing"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert "drop_from_best" in {a["rule"] for a in listed}
    drop = next(a for a in listed if a["rule"] == "drop_from_best")
    assert (drop["run"], drop["step"], drop["state"], drop["rollback_step"]) == ("grpo", 1100, "firing", 1000)
    assert (drop["delivered"], drop["queued"]) == (0, 1)

    assert main(["--config", str(path), "alerts", "--run", "grpo"]) == 0
    out = capsys.readouterr().out
    assert "drop_from_best" in out and "0/1" in out
    assert main(["--config", str(path), "alerts", "--state", "resolved"]) == 0
    assert capsys.readouterr().out.strip() == "no alerts"


def test_the_onset_is_kept_across_repeats_and_shown_by_the_cli_and_the_api(
    database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 20: accuracy collapsed at 1100 and stayed down at 1200 and 1300; the webhook's first notice
    said 1100, and so must ``evald alerts`` and the API (``step``/``first_step``), with the latest step
    beside it; after recovery the episode keeps its span and says where it resolved."""
    from starlette.testclient import TestClient

    from daemon.config import load_config
    from daemon.web.app import create_app

    config = make_config(tmp_path)
    alerter = Alerter(config)
    for i, value in enumerate([*PLATEAU, 0.35, 0.34, 0.33]):
        store(database, config, alerter, (i + 1) * 100, value)
    path = tmp_path / "evald.toml"
    path.write_text(config_text(tmp_path) + f'\n[database]\nurl = "{database.url}"\n')
    capsys.readouterr()

    assert main(["--config", str(path), "alerts", "--format", "json", "--state", "firing"]) == 0
    drop = next(a for a in json.loads(capsys.readouterr().out) if a["rule"] == "drop_from_best")
    assert (drop["step"], drop["first_step"], drop["last_step"], drop["resolved_step"]) == (
        1100,
        1100,
        1300,
        None,
    )
    assert main(["--config", str(path), "alerts"]) == 0
    assert "1100..1300" in capsys.readouterr().out
    served = Database(database.url, read_only=True)
    try:
        with TestClient(create_app(load_config(path), database=served)) as web:
            answer = web.get("/api/v1/alerts", params={"run": "grpo", "state": "firing"})
    finally:
        served.dispose()
    assert answer.status_code == 200, answer.text
    api = next(a for a in answer.json()["items"] if a["rule"] == "drop_from_best")
    assert {k: api[k] for k in ("step", "first_step", "last_step")} == {
        "step": 1100,
        "first_step": 1100,
        "last_step": 1300,
    }
    first_notice = json.loads(_bodies(database)[0])
    assert (first_notice["step"], first_notice["first_step"], first_notice["last_step"]) == (1100, 1100, 1100)

    for step in (1400, 1500):
        store(database, config, alerter, step, 0.61)
    with database.session() as s:
        [done] = [a for a in alerting.alert_rows(s) if a.rule == "drop_from_best"]
    assert (done.state, done.first_step, done.last_step, done.resolved_step) == ("resolved", 1100, 1300, 1400)
    resolved = json.loads(_bodies(database)[-1])
    assert (resolved["state"], resolved["step"], resolved["first_step"], resolved["resolved_step"]) == (
        "resolved",
        1400,
        1100,
        1400,
    )

    # It fires again later: a new episode with its own onset.
    store(database, config, alerter, 1600, 0.30)
    with database.session() as s:
        [again] = [a for a in alerting.alert_rows(s) if a.rule == "drop_from_best"]
    assert (again.state, again.first_step, again.last_step, again.resolved_step) == (
        "firing",
        1600,
        1600,
        None,
    )


def test_a_late_result_for_an_older_step_moves_the_onset_back_not_the_latest_finding(
    database: Database, tmp_path: Path
) -> None:
    """The backlog runs newest first: 1200's collapse is stored before 1100's. The onset is the earliest
    step the alert fired at (1100); its value and message stay those of the newest finding (1200)."""
    config = make_config(tmp_path)
    alerter = Alerter(config)
    for i, value in enumerate(PLATEAU):
        store(database, config, alerter, (i + 1) * 100, value)
    store(database, config, alerter, 1200, 0.30)
    with database.session() as s:
        [newest] = [a for a in alerting.alert_rows(s) if a.rule == "drop_from_best"]
    store(database, config, alerter, 1100, 0.35)
    with database.session() as s:
        [alert] = [a for a in alerting.alert_rows(s) if a.rule == "drop_from_best"]
    assert (alert.first_step, alert.last_step, alert.step) == (1100, 1200, 1100)
    assert (alert.value, alert.message) == (newest.value, newest.message) and alert.value == 0.30


def test_the_detectors_never_see_a_metric_over_no_samples(database: Database, tmp_path: Path) -> None:
    """A worker of another version (or lm-eval) that still reports 0.0 with n = 0: the series the
    detectors read leaves it out, so a plateau with such a point raises nothing."""
    config = make_config(tmp_path)
    alerter = Alerter(config)
    for i, value in enumerate(PLATEAU):
        store(database, config, alerter, (i + 1) * 100, value)
    with database.session() as s:
        run_id = queries.ensure_run(s, "grpo", str(config.runs[0].root))
        checkpoint = queries.record_checkpoint(
            s,
            run_id=run_id,
            path="/runs/grpo/step_1100",
            name="step_1100",
            step=1100,
            epoch=None,
            layout="hf",
            state=CheckpointState.READY,
        )
        queries.enqueue_jobs(s, checkpoint_id=checkpoint, step=1100, tasks=("math",))
    with database.session() as s:
        job = queries.claim_next_job(s, "test:1")
        assert job is not None
    with database.session() as s:
        rows = [queries.MetricRow("accuracy", 0.0, 0, None), queries.MetricRow("wall_s", 1.0, None, None)]
        assert queries.complete_job(
            s, job_id=job.id, owner="test:1", metrics=rows, samples=[], duration_s=1.0, load_s=None
        )
        alerter.after_result(s, job)
        series = alerting.run_series(s, run_id=run_id, task="math", stage=job.stage)
    assert [r.step for r in series["accuracy"]] == [(i + 1) * 100 for i in range(len(PLATEAU))]
    assert [r.step for r in series["wall_s"]] == [1100]
    with database.session() as s:
        assert alerting.alert_rows(s) == []


def _bodies(database: Database) -> list[str]:
    from sqlalchemy import select

    from storage.models import OutboxMessage

    with database.session() as s:
        return list(s.scalars(select(OutboxMessage.body).order_by(OutboxMessage.id)))


def test_upgrading_keeps_what_old_alert_rows_knew_of_their_steps(database_url: str) -> None:
    """Migration 0008: a firing alert's one ``step`` (its latest finding, the earliest step still known)
    becomes its first and last step; a resolved alert's was where it resolved (its onset was overwritten:
    left unknown, not filled with a step that is not the onset). Downgrading puts ``step`` back."""
    import sqlalchemy as sa

    db = Database(database_url)
    migrations.upgrade(db, "0007")
    t0 = utcnow()
    alerts = sa.table(
        "alerts",
        *(sa.column(c) for c in ("id", "fingerprint", "run_id", "rule", "severity", "state", "step")),
        *(sa.column(c) for c in ("message", "fired_at", "updated_at", "repeats")),
    )
    with db.session() as s:
        s.execute(
            sa.text("INSERT INTO runs (id, name, root, created_at) VALUES (1, 'old', '/r', :t)"), {"t": t0}
        )
        for i, (state, step) in enumerate([("firing", 960), ("resolved", 1080), ("firing", None)], start=1):
            s.execute(
                sa.insert(alerts).values(
                    id=i,
                    fingerprint=f"fp{i}",
                    run_id=1,
                    rule="drop_from_best",
                    severity="critical",
                    state=state,
                    step=step,
                    message="m",
                    fired_at=t0,
                    updated_at=t0,
                    repeats=2,
                )
            )
    # A result stored before 0008 with a metric over no samples (0.0 with n = 0): not a value, deleted.
    job = oldrows.finished_job(db, run_id=1, path="/r/step_5", step=5, task="math")
    for metric, value, n, stderr in (
        ("response_length_correct", 0.0, 0, None),
        ("accuracy", 0.0, 50, 0.02),
        ("wall_s", 2.0, None, None),
    ):
        oldrows.insert(
            db, "results", job_id=job, metric=metric, value=value, n=n, stderr=stderr, created_at=t0
        )
    migrations.upgrade(db)
    with db.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT metric, value, n FROM results ORDER BY metric")).all()
    assert [tuple(r) for r in stored] == [("accuracy", 0.0, 50), ("wall_s", 2.0, None)]
    with db.session() as s:
        rows = {r.id: r for r in alerting.alert_rows(s)}
    assert [(rows[i].first_step, rows[i].last_step, rows[i].resolved_step) for i in (1, 2, 3)] == [
        (960, 960, None),
        (None, None, 1080),
        (None, None, None),
    ]
    migrations.downgrade(db, "0007")
    with db.engine.connect() as conn:
        back: dict[int, int | None] = dict(
            conn.execute(sa.text("SELECT id, step FROM alerts ORDER BY id")).all()
        )
    assert back == {1: 960, 2: 1080, 3: None}
    db.dispose()


def test_evald_webhook_test_sends_a_signed_test_alert(
    database: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALD_TEST_SECRET", SECRET.reveal_text())
    with WebhookReceiver(SECRET) as receiver:
        path = tmp_path / "evald.toml"
        text = config_text(tmp_path, url=receiver.url)
        path.write_text(text + f'\n[database]\nurl = "{database.url}"\n')
        with database.session() as s:
            disable_endpoint(s, "hook", "answered 410 Gone")

        assert main(["--config", str(path), "webhook", "test", "hook"]) == 0

        [got] = receiver.wait_for(1)
    out = capsys.readouterr().out
    assert out.startswith("hook: HTTP 200 in ") and f"webhook-id {got.webhook_id}" in out
    assert json.loads(got.body)["rule"] == "webhook_test" and got.error is None
    with database.session() as s:
        assert disabled(s, "hook") is None
    assert main(["--config", str(path), "webhook", "test", "nope"]) == 2


def test_a_late_result_for_an_older_step_does_not_resolve_newer_alerts(
    database: Database, tmp_path: Path
) -> None:
    config = make_config(tmp_path)
    alerter = Alerter(config)
    for i, value in enumerate(PLATEAU):
        store(database, config, alerter, (i + 1) * 100, value)
    store(database, config, alerter, 1100, 0.35)

    # The backlog ran newest first: step 1050's good result lands after 1100's bad one.
    store(database, config, alerter, 1050, 0.61)

    with database.session() as s:
        assert "firing" in {a.state for a in alerting.alert_rows(s) if a.rule == "drop_from_best"}
    assert json.loads((tmp_path / "feedback" / "grpo.json").read_text())["step"] == 1100


def test_a_message_refused_for_good_stops_blocking_its_run(
    database: Database, relay_config: tuple[Config, int]
) -> None:
    config, port = relay_config
    with WebhookReceiver(SECRET, port=port) as receiver:
        receiver.respond(400, times=5)
        relay = Relay(database, [Endpoint(config.webhooks[0], SECRET)]).start()
        try:
            fire_cliffs(database, config, Alerter(config, wake=relay.wake), 1)
            queued = len(outbox(database))
            receiver.wait_for(queued - 1, timeout=30)
            wait_for_states = Deadline(10)
            while not wait_for_states.expired() and "pending" in {row[1] for row in outbox(database)}:
                time.sleep(0.1)
        finally:
            relay.stop()
    states = [row[1] for row in outbox(database)]
    assert states[0] == "failed" and set(states[1:]) == {"delivered"}


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("[alerts.detectors]\nwindow = 1\n", "window and min_history must be at least 2"),
        ("[alerts.detectors]\newma_lambda = 3\n", "ewma_lambda must be in (0, 1]"),
        ("[alerts.detectors]\nwindoww = 3\n", "unknown detector setting windoww"),
        ("[alerts.thresholds.accuracy]\nmin = 0.9\nmax = 0.1\n", "thresholds.accuracy: min > max"),
        ('[alerts.links]\ndashboard = ""\n', "empty link dashboard"),
    ],
)
def test_bad_alert_settings_are_named(tmp_path: Path, extra: str, problem: str) -> None:
    text = config_text(tmp_path).replace("[alerts]\n", "[alerts]\n", 1) + "\n" + extra
    text = text.replace('links = { dashboard = "https://grafana.example/d/evald" }\n', "")
    with pytest.raises(ConfigError) as raised:
        parse_config(tomllib.loads(text), base_dir=tmp_path, source="test", environ={})
    assert any(problem in p for p in raised.value.problems), raised.value.problems


def test_an_alert_is_seen_at_every_step_of_its_episode_not_only_its_onset() -> None:
    def row(first: int | None, last: int | None) -> alerting.AlertRow:
        return alerting.AlertRow(
            id=1, run="r", task="t", metric="accuracy", rule="drop_from_best", severity="warning",
            state="firing", first_step=first, last_step=last, resolved_step=None, value=0.1, baseline=0.9,
            best_step=720, rollback_step=720, message="m", fired_at=utcnow(), resolved_at=None,
            repeats=1, delivered=0, queued=0,
        )  # fmt: skip

    collapse = row(840, 960)
    assert [s for s in (720, 840, 900, 960, 1080) if collapse.seen_at(s)] == [840, 900, 960]
    assert row(840, None).seen_at(840) and not row(840, None).seen_at(960)
    assert not row(None, None).seen_at(840)
