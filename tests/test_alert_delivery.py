"""Alert delivery through the real daemon: a receiver that is down while checkpoints are evaluated, a daemon
killed with alerts stored but unsent, and a restart that delivers each of them exactly once, in order."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest
from sqlalchemy import select

from daemon.config import Secret
from daemon.delivery.receiver import WebhookReceiver
from storage.database import Database
from storage.models import OutboxMessage
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    DaemonProcess,
    all_jobs_done,
    running_daemon,
    upgraded,
    wait_for,
    write_config,
    write_dataset,
)

pytestmark = pytest.mark.slow

SECRET = Secret.generate()
ENV = {"EVALD_TEST_WEBHOOK_SECRET": SECRET.reveal_text()}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def outbox(database: Database) -> list[tuple[str, str, int]]:
    """(webhook-id, state, attempts) of every queued notification, in the order they were queued."""
    with database.session() as s:
        rows = s.scalars(select(OutboxMessage).order_by(OutboxMessage.id)).all()
        return [(r.event_id, r.state.value, r.attempts) for r in rows]


@pytest.mark.long
def test_alerts_survive_a_receiver_outage_and_a_killed_daemon(
    database_url: str, toy_run: ToyRun, tmp_path: Path
) -> None:
    dataset = write_dataset(tmp_path / "arith.jsonl", 10)
    port = free_port()
    database = upgraded(database_url)
    config = write_config(tmp_path, database_url, dataset=dataset)
    # A threshold every result crosses, with no cooldown: one firing notification per checkpoint.
    with config.open("a") as extra:
        extra.write(
            "\n[alerts]\ncooldown_secs = 0\n[alerts.thresholds.wall_s]\nmin = 1000000\n"
            f'[[webhooks]]\nname = "oncall"\nurl = "http://127.0.0.1:{port}/hook"\n'
            'secret_env = "EVALD_TEST_WEBHOOK_SECRET"\ntimeout_secs = 1.0\nmax_backoff_secs = 1.0\n'
        )
    steps = (10, 20, 30)
    for step in steps:
        copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / f"step_{step}")

    first = DaemonProcess(config, tmp_path / "daemon-1.log", ENV)
    first.wait_ready()
    # Nobody listens: every checkpoint is still evaluated, and every alert waits in the outbox.
    wait_for(lambda: all_jobs_done(database, len(steps)), 240, "every job evaluated", first.process)
    # The relay keeps trying the run's first alert; the later ones wait behind it (a run's alerts in order).
    # How many notices the episode made depends on the order the backlog ran in (a late result inside the
    # episode is no news): one at least, and one per checkpoint at most.
    wait_for(
        lambda: (1 <= len(outbox(database)) <= len(steps) and outbox(database)[0][2] >= 2) or None,
        30,
        "the relay to have retried the first alert",
        first.process,
    )
    assert {state for _, state, _ in outbox(database)} == {"pending"}
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    with (
        WebhookReceiver(SECRET, port=port) as receiver,
        running_daemon(config, tmp_path / "daemon-2.log", ENV),
    ):
        delivered = receiver.wait_for(len(outbox(database)), timeout=60)
        attempts = receiver.attempts
        # The receiver answered before the relay wrote "delivered" down.
        wait_for(
            lambda: {state for _, state, _ in outbox(database)} == {"delivered"} or None, 10, "delivered"
        )
    queued = outbox(database)
    assert [a.webhook_id for a in delivered] == [event_id for event_id, _, _ in queued]
    assert all(a.error is None for a in attempts)
    assert {state for _, state, _ in queued} == {"delivered"}
    bodies = [json.loads(a.body) for a in delivered]
    assert [b["rule"] for b in bodies] == ["threshold"] * len(queued)
    # One alert fired at every checkpoint: each notice names its onset (``step``) and the span it has
    # fired over so far; the last spans them all, whichever order the backlog was evaluated in.
    assert all(b["step"] == b["first_step"] <= b["last_step"] for b in bodies)
    assert all(b["first_step"] in steps and b["last_step"] in steps for b in bodies)
    assert bodies[0]["first_step"] == bodies[0]["last_step"]
    assert (bodies[-1]["first_step"], bodies[-1]["last_step"]) == (min(steps), max(steps))
    database.dispose()
