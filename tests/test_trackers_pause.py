"""A tracker whose credentials were refused: paused, said so by ``evald status`` with the pause's true end,
and tried at once when what could fix the refusal changes (issue 45).

The relay's decisions run on the in-memory sink over a real database (SQLite and PostgreSQL), its rows
under a tracker's endpoint so that ``evald status`` reads them as a configured tracker's; the daemon
reloaded with SIGHUP against a real MLflow server is tests/test_trackers_reload.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from daemon.cli import main
from daemon.config import TrackerConfig
from daemon.delivery.errors import SinkRefused, SinkUnavailable
from daemon.delivery.memory import Memory, MemoryRoute
from daemon.delivery.relay import Lane
from daemon.delivery.trackers import CHANGED, STARTED, tracker_routes
from storage import outbox, queries
from storage.database import Database
from storage.models import OutboxMessage, utcnow
from tests.harness import write_config, write_dataset

REFUSED = "log_batch: credentials refused (HTTP 401): {'error_code': 'UNAUTHENTICATED'}"
PAUSE_S = 600.0
#: A receiver's Retry-After: a back-off the status must show as it is, not as "now".
BACKOFF_S = 120.0

TRACKERS = """
[[trackers]]
kind = "tensorboard"
name = "tb"

[[trackers]]
kind = "tensorboard"
name = "down"
"""


def _route(name: str, memory: Memory, **settings: Any) -> MemoryRoute:
    """A route to the in-memory sink whose rows are the configured tracker ``name``'s."""
    route = MemoryRoute(name, memory, batch=10, **settings)
    route.endpoint = f"tracker:{name}"
    return route


def _queue(database: Database, route: MemoryRoute, ids: Sequence[str], run: str) -> None:
    with database.session() as s:
        run_id = queries.ensure_run(s, run, f"/{run}")
        for event_id in ids:
            assert outbox.enqueue_message(
                s, run_id=run_id, endpoint=route.endpoint, event_id=event_id, body=event_id
            )


def _rows(database: Database) -> dict[str, OutboxMessage]:
    with database.session() as s:
        rows = s.scalars(select(OutboxMessage)).all()
        s.expunge_all()
    return {r.event_id: r for r in rows}


def _status(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    capsys.readouterr()
    assert main(["--config", str(config), "status", *extra]) == 0
    return capsys.readouterr().out


def test_a_paused_tracker_says_why_and_when_it_tries_next_not_now(
    database: Database, database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path, database_url, dataset=write_dataset(tmp_path / "d.jsonl", 2))
    with config.open("a") as extra:
        extra.write(TRACKERS)
    # Refused: paused for PAUSE_S. Then more results come (the run's next, another run's first): queued
    # behind the pause, due "now" by their own rows, but the relay claims nothing until it ends.
    refusing = _route("tb", Memory(failing=SinkRefused(REFUSED, status=401)), pause_secs=PAUSE_S)
    _queue(database, refusing, ["a1", "a2"], "toy")
    lane = Lane(database, refusing)
    assert lane.send(lane.claim()).paused
    _queue(database, refusing, ["a3"], "toy")
    _queue(database, refusing, ["b1"], "other")
    # The server away, with a Retry-After: backing off, with a result queued behind the one tried.
    down = _route("down", Memory(failing=SinkUnavailable("HTTP 503", status=503, retry_after=BACKOFF_S)))
    _queue(database, down, ["d1"], "toy")
    lane = Lane(database, down)
    assert lane.send(lane.claim()).stopped
    _queue(database, down, ["d2"], "toy")

    rows = _rows(database)
    # The relay keeps the refusal marked as a pause; a back-off keeps its error as it is.
    assert rows["a1"].last_error == outbox.paused_error(REFUSED) == rows["a2"].last_error
    assert outbox.pause_reason(rows["a1"].last_error) == REFUSED
    assert rows["d1"].last_error == "HTTP 503" and outbox.pause_reason(rows["d1"].last_error) is None

    shown = {t["name"]: t for t in json.loads(_status(config, capsys, "--format", "json"))["trackers"]}
    tb, backing_off = shown["tb"], shown["down"]
    assert (tb["state"], tb["pending"], tb["attempts"], tb["last_error"]) == ("paused", 4, 1, REFUSED)
    # The pause's end, not the "now" of the messages queued behind it (the bug said "next try now").
    assert PAUSE_S - 60 < tb["next_attempt_in_s"] <= PAUSE_S
    assert (backing_off["state"], backing_off["pending"], backing_off["last_error"]) == (
        "failing",
        2,
        "HTTP 503",
    )
    assert BACKOFF_S - 60 < backing_off["next_attempt_in_s"] <= BACKOFF_S

    text = _status(config, capsys)
    lines = text.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.startswith("  tb (tensorboard): ")]
    assert re.fullmatch(
        r"  tb \(tensorboard\): PAUSED \(credentials refused\): 4 pending, oldest \d+s old; "
        r"tried 1 time\(s\), next try in (9m [45]\ds|10m 00s)",
        lines[at],
    ), lines[at]
    assert lines[at + 1] == f"    refused: {REFUSED}"
    assert "a restart, or a reload that changes this tracker's table" in lines[at + 2]
    assert re.search(
        r"  down \(tensorboard\): FAILING: 2 pending, oldest \d+s old; tried 1 time\(s\), "
        r"next try in (1m [0-5]\ds|2m 00s)",  # 2m 00s: shown within a second of the try
        text,
    ), text
    assert "next try now" not in text


def test_retry_now_ends_the_pause_and_the_back_off_of_messages_tried_only(database: Database) -> None:
    memory = Memory(failing=SinkRefused(REFUSED, status=401))
    refusing = _route("tb", memory, pause_secs=PAUSE_S)
    _queue(database, refusing, ["a1", "a2"], "toy")
    lane = Lane(database, refusing)
    assert lane.send(lane.claim()).paused
    # A message of another run claimed for its first try (a relay holds it: its lease is not cut short),
    # and another tracker's paused message (not this one's to end).
    _queue(database, refusing, ["b1"], "other")
    with database.session() as s:
        (claimed,) = outbox.due_many(
            s, endpoint=refusing.endpoint, now=utcnow(), lease=timedelta(seconds=60), limit=10
        )
    other = _route("other", Memory(failing=SinkRefused(REFUSED)), pause_secs=PAUSE_S)
    _queue(database, other, ["o1"], "toy")
    lane = Lane(database, other)
    assert lane.send(lane.claim()).paused

    now = utcnow()
    with database.session() as s:
        assert outbox.retry_now(s, endpoint=refusing.endpoint, target=None, now=now) == 2
    rows = _rows(database)
    for event_id in ("a1", "a2"):
        # Due now, no longer marked paused: the refusal stays the last error until the next try says more.
        assert rows[event_id].last_error == REFUSED
        assert rows[event_id].next_attempt_at.replace(tzinfo=None) <= now.replace(tzinfo=None)
    assert claimed.event_id == "b1" and rows["b1"].next_attempt_at.replace(tzinfo=None) > now.replace(
        tzinfo=None
    )
    assert rows["o1"].last_error == outbox.paused_error(REFUSED)
    # The relay, its credential fixed, sends them at once.
    memory.failing = None
    lane = Lane(database, refusing)
    assert lane.send(lane.claim()).delivered == 2
    assert memory.ids() == ["a1", "a2"]


def test_only_a_change_that_can_fix_a_refusal_ends_the_pause() -> None:
    wrong = TrackerConfig(kind="tensorboard", name="tb", pause_secs=600)
    kept = TrackerConfig(kind="tensorboard", name="kept")
    fixed = wrong.model_copy(update={"pause_secs": 5.0})
    added = TrackerConfig(kind="tensorboard", name="added")
    # At a start, every tracker: the environment its credentials come from may have changed.
    assert [r.resume for r in tracker_routes([wrong, kept], {})] == [STARTED, STARTED]
    # At a reload, a tracker whose table changed (credentials' variables, URL, any setting) or that is
    # new; one unchanged keeps its pause (the daemon's environment is the same, the refusal would be too).
    routes = tracker_routes([fixed, kept, added], {}, before=[wrong, kept])
    assert [r.resume for r in routes] == [CHANGED, None, CHANGED]
    assert [r.resume for r in tracker_routes([wrong, kept], {}, before=[wrong, kept])] == [None, None]
