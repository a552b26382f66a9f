"""The outbox's batched claims for trackers (``storage.outbox.due_many``) on SQLite and PostgreSQL: many
messages of a run in one claim, each run's in the order queued, a run held back while its oldest message
backs off or is claimed elsewhere, and two relays claiming at once never sharing a message."""

from __future__ import annotations

import threading
from datetime import timedelta

from storage import outbox, queries
from storage.database import Database
from storage.models import utcnow

ENDPOINT = "tracker:mlflow"
LEASE = timedelta(seconds=60)


def queue(database: Database, runs: dict[str, int]) -> dict[str, list[str]]:
    """``n`` messages for each run, interleaved as runs evaluated side by side queue them."""
    ids: dict[str, list[str]] = {run: [] for run in runs}
    with database.session() as s:
        run_ids = {run: queries.ensure_run(s, run, f"/{run}") for run in runs}
        for i in range(max(runs.values())):
            for run, n in runs.items():
                if i < n:
                    event = f"trk_{run}_{i}"
                    assert outbox.enqueue_message(
                        s, run_id=run_ids[run], endpoint=ENDPOINT, event_id=event, body="{}"
                    )
                    ids[run].append(event)
    return ids


def claim(database: Database, limit: int) -> list[outbox.Due]:
    with database.session() as s:
        return outbox.due_many(s, endpoint=ENDPOINT, now=utcnow(), lease=LEASE, limit=limit)


def test_one_claim_takes_many_of_each_run_in_order(database: Database) -> None:
    ids = queue(database, {"a": 5, "b": 3})
    first = claim(database, 6)
    assert [d.event_id for d in first] == ["trk_a_0", "trk_b_0", "trk_a_1", "trk_b_1", "trk_a_2", "trk_b_2"]
    # Claimed: leased, so neither this relay nor another takes them again, and the runs' later messages
    # wait behind them (their oldest is claimed).
    assert claim(database, 10) == []
    with database.session() as s:
        outbox.delivered_many(s, [d.id for d in first])
    assert [d.event_id for d in claim(database, 10)] == ids["a"][3:]


def test_a_run_whose_oldest_message_backs_off_waits_and_the_others_go(database: Database) -> None:
    queue(database, {"a": 3, "b": 2})
    (head,) = claim(database, 1)
    assert head.event_id == "trk_a_0"
    with database.session() as s:
        outbox.record_attempts(s, [head.id], outbox.Attempt(utcnow(), 0.1, None, "down"))
        outbox.retry_many_at(s, [head.id], utcnow() + timedelta(seconds=30), "down")
    # a's later messages are due but wait behind its oldest: order within a run holds.
    assert [d.event_id for d in claim(database, 10)] == ["trk_b_0", "trk_b_1"]


def test_two_relays_claiming_at_once_share_no_message(database: Database) -> None:
    queue(database, {f"r{i}": 30 for i in range(4)})
    claimed: list[list[outbox.Due]] = []
    barrier = threading.Barrier(2)

    def relay() -> None:
        barrier.wait()
        got: list[outbox.Due] = []
        while batch := claim(database, 7):
            got += batch
            with database.session() as s:
                outbox.delivered_many(s, [d.id for d in batch])
        claimed.append(got)

    threads = [threading.Thread(target=relay) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    every = [d.event_id for got in claimed for d in got]
    assert len(every) == 120 and len(set(every)) == 120


def test_rows_of_another_target_wait_and_rows_from_before_targets_are_adopted(database: Database) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, "a", "/a")
        # Queued before targets were kept (no target), under the id it had then.
        assert outbox.enqueue_message(s, run_id=run_id, endpoint=ENDPOINT, event_id="trk_old", body="{}")
        assert outbox.enqueue_message(
            s, run_id=run_id, endpoint=ENDPOINT, event_id="trk_b1", body="{}", target="mlflow:b"
        )
        # The same message for target a, its old id known: not queued again (adopted instead).
        assert not outbox.enqueue_message(
            s,
            run_id=run_id,
            endpoint=ENDPOINT,
            event_id="trk_a1",
            body="{}",
            target="mlflow:a",
            legacy_id="trk_old",
        )
        # For target b the old row is no proof: b never had it.
        assert outbox.adopt(s, endpoint=ENDPOINT, target="mlflow:a") == 1
        assert outbox.enqueue_message(
            s,
            run_id=run_id,
            endpoint=ENDPOINT,
            event_id="trk_b0",
            body="{}",
            target="mlflow:b",
            legacy_id="trk_old",
        )
        assert outbox.other_targets(s, endpoint=ENDPOINT, target="mlflow:a") == ["mlflow:b"]
        assert outbox.known_ids(s, ["trk_old", "trk_b1"], target="mlflow:a") == {"trk_old"}

    def claim_for(target: str) -> list[str]:
        with database.session() as s:
            got = outbox.due_many(s, endpoint=ENDPOINT, now=utcnow(), lease=LEASE, limit=10, target=target)
            return [d.event_id for d in got]

    # Each target's own rows only, each run's in order within it (b's head is not held back by a's).
    assert claim_for("mlflow:b") == ["trk_b1", "trk_b0"]
    assert claim_for("mlflow:a") == ["trk_old"]
    assert claim_for("mlflow:c") == []
