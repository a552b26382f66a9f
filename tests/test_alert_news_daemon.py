"""A real daemon tells a real webhook receiver the same alerts whether a run's checkpoints arrive in step
order or shuffled (issue 45).

The demo's trainer learns for 720 steps, then its learning rate jumps. Its eight checkpoints feed two runs
of one ``evald run``: ``sorted`` has them all on disk before the start and takes them oldest first;
``shuffled`` gets them one at a time in a shuffled order, each once the one before is evaluated, the
collapse's first checkpoint last, after the newest: so late older results re-judge its series and move
the collapse's onset back. A signed-webhook receiver on loopback records what arrives. For each run,
each alert's last notice must say what the stored alert says (state and onset; all steps once resolved);
both runs' receivers must end with the same view; the sorted run is never sent an ``updated`` notice.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from daemon.config import Secret
from daemon.delivery.receiver import WebhookReceiver
from daemon.demo import COLLAPSE_AT, SECRET_ENV, TRAIN_STEPS, write_workspace
from storage import alerting
from storage.database import Database
from storage.models import OutboxMessage, OutboxState
from tests.harness import all_jobs_done, jobs, running_daemon, start_trainer, upgraded, wait_for
from tests.test_alert_news import view

pytestmark = [pytest.mark.slow, pytest.mark.long]

SECRET_TEXT = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
RUNS = {"sorted": "oldest_first", "shuffled": "newest_first"}


def _pending(database: Database) -> int:
    with database.session() as s:
        return int(
            s.scalar(
                select(func.count())
                .select_from(OutboxMessage)
                .where(OutboxMessage.state == OutboxState.PENDING)
            )
            or 0
        )


def _evaluated(database: Database, run: str) -> int:
    return sum(1 for j in jobs(database) if j.run == run and j.state == "succeeded")


Key = tuple[str, str | None, str | None]


def _heard(receiver: WebhookReceiver) -> dict[str, dict[Key, list[dict[str, Any]]]]:
    """Each run's notices per alert (rule, metric, task), in the order the receiver got them."""
    heard: dict[str, dict[Key, list[dict[str, Any]]]] = {run: {} for run in RUNS}
    for delivery in receiver.deliveries:
        body = json.loads(delivery.body)
        heard[body["run"]].setdefault((body["rule"], body["metric"], body["task"]), []).append(body)
    return heard


def test_a_shuffled_and_a_sorted_backlog_tell_the_receiver_the_same_alerts(tmp_path: Path) -> None:
    trained = tmp_path / "trained"
    trainer = start_trainer(
        trained, tmp_path / "trainer.log", "--steps", str(TRAIN_STEPS), "--collapse-at", str(COLLAPSE_AT)
    )
    # No limit of its own: on a loaded machine training takes what it takes (the test's timeout guards).
    assert trainer.wait() == 0, (tmp_path / "trainer.log").read_text()[-2000:]
    folders = {int(p.name.split("_")[-1]): p for p in trained.iterdir() if p.is_dir()}
    steps = sorted(folders)
    assert len(steps) == 8 and COLLAPSE_AT in steps
    # The collapse's first checkpoint arrives last, after the newest: judged without it, the newest is the
    # onset (the receivers were told 960), until it comes and moves the onset back, once.
    onset, newest = steps[steps.index(COLLAPSE_AT) + 1], steps[-1]
    earlier = [s for s in steps if s not in (onset, newest)]
    shuffled = [*random.Random(45).sample(earlier, len(earlier)), newest, onset]

    with WebhookReceiver(Secret.parse(SECRET_TEXT)) as receiver:
        config = write_workspace(tmp_path, receiver_url=receiver.url)
        one_run = f'[[runs]]\nname = "toy"\nroot = "{tmp_path / "run"}"\nlayout = "auto"\n'
        text = config.read_text(encoding="utf-8")
        assert one_run in text
        runs = "".join(
            f'[[runs]]\nname = "{run}"\nroot = "{tmp_path / run}"\nlayout = "auto"\nbacklog = "{backlog}"\n\n'
            for run, backlog in RUNS.items()
        )
        # Every alert to the receiver, info ones too (the demo's webhook, its last table, takes warnings up).
        assert text.rstrip().endswith(f'secret_env = "{SECRET_ENV}"')
        config.write_text(text.replace(one_run, runs) + 'min_severity = "info"\n', encoding="utf-8")
        shutil.copytree(trained, tmp_path / "sorted", symlinks=True)
        (tmp_path / "shuffled").mkdir()
        database: Database = upgraded(f"sqlite:///{tmp_path / 'evald.db'}")
        env = {**os.environ, SECRET_ENV: SECRET_TEXT}
        with running_daemon(config, tmp_path / "daemon.log", env=env) as daemon:
            for n, step in enumerate(shuffled, start=1):
                source = folders[step]
                shutil.copytree(source, tmp_path / "shuffled" / source.name, symlinks=True)
                wait_for(
                    lambda: _evaluated(database, "shuffled") >= n or None,  # noqa: B023
                    600,
                    f"the shuffled run's checkpoint {n} (step {step}) evaluated",
                    daemon.process,
                )
            wait_for(
                lambda: all_jobs_done(database, 2 * len(steps)), 900, "both runs evaluated", daemon.process
            )
            wait_for(lambda: _pending(database) == 0 or None, 120, "every notice delivered", daemon.process)
            assert daemon.stop() == 0
        heard = _heard(receiver)
    with database.session() as s:
        stored = {run: alerting.alert_rows(s, run=run) for run in RUNS}
    database.dispose()

    finals: dict[str, dict[Key, tuple[object, ...]]] = {}
    for run, alerts in stored.items():
        told = heard[run]
        assert {(a.rule, a.metric, a.task) for a in alerts} == set(told), run
        finals[run] = {}
        for alert in alerts:
            last = told[(alert.rule, alert.metric, alert.task)][-1]
            if alert.state == "resolved" and alert.resolved_step is None:
                # Withdrawn (judged on a shorter series): its receivers heard it end.
                assert last["state"] == "resolved", (run, alert)
                continue
            said = view(last["state"], last["first_step"], last["last_step"], last["resolved_step"])
            assert said == view(alert.state, alert.first_step, alert.last_step, alert.resolved_step), (
                run,
                alert,
                told[(alert.rule, alert.metric, alert.task)],
            )
            finals[run][(alert.rule, alert.metric, alert.task)] = said
    # The collapse is among them, at the first checkpoint after it, in both; the shuffled run's receiver
    # heard it first at the newest step, then one update carrying the onset.
    collapse = ("drop_from_best", "accuracy", "arith")
    assert finals["sorted"][collapse][1] == onset, finals
    moved = heard["shuffled"][collapse]
    assert moved[0]["first_step"] == newest, moved
    assert [n["first_step"] for n in moved if n["event"] == "updated"] == [onset], moved
    assert finals["shuffled"] == finals["sorted"]
    assert not [n for notices in heard["sorted"].values() for n in notices if n["event"] == "updated"]
