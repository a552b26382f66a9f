"""APScheduler jobs: a job that raises is logged by name and the others keep their schedule."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from structlog.testing import capture_logs

from daemon.scheduling.timers import Timers
from tests.harness import wait_for


def test_a_failing_job_is_logged_by_name_and_never_stops_the_others() -> None:
    timers = Timers()
    ticks: list[float] = []

    def broken() -> None:
        raise RuntimeError("the database went away")

    timers.every("housekeeping", 0.05, broken)
    timers.every("rescan", 0.05, lambda: ticks.append(1.0))
    with capture_logs() as logs:
        timers.start()
        try:
            wait_for(lambda: len(ticks) >= 5 or None, 10, "five rescans")
            wait_for(
                lambda: sum(e["event"] == "scheduler.job_failed" for e in logs) >= 2 or None,
                10,
                "two failures",
            )
        finally:
            timers.shutdown()
    failures = [e for e in logs if e["event"] == "scheduler.job_failed"]
    assert {e["job"] for e in failures} == {"housekeeping"}
    assert "the database went away" in failures[0]["error"]


def test_every_replaces_a_job_of_the_same_name_and_starts_when_told() -> None:
    timers = Timers()
    fired = threading.Event()
    later = datetime.now(UTC) + timedelta(seconds=0.3)
    timers.every("time:run", 3600, lambda: None)
    timers.every("time:run", 3600, fired.set, first=later)
    assert timers.names() == ["time:run"]
    timers.start()
    try:
        assert fired.wait(5)
        assert datetime.now(UTC) >= later
    finally:
        timers.shutdown()
