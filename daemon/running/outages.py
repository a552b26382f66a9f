"""Outages of the executor's controller (a Ray head, Slurm's controller) as the database keeps them for
``evald status``: each one begun or ended is an event (``executor_unreachable`` / ``executor_reachable``,
its message JSON: what is away, since when, its error, the daemon that saw it), and while one lasts every
job handed to the executor has a state nobody knows, stored as ``UNKNOWN since <when> (<what> does not
answer; last <its state before>)`` until the controller's next answer replaces it.

:class:`~daemon.running.executor_watch.ExecutorWatch` says when an outage begins and ends; the
dispatcher's bookkeeping stores it here, as it stores the jobs' states.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from daemon.running import remote
from daemon.running.attempt import Attempt
from storage import scheduling
from storage.database import Database


@dataclass(frozen=True)
class Outage:
    """An outage of the executor's controller that began (``reachable`` False) or ended, for the
    database (``evald status`` shows it): when it began, what is away and what it said."""

    reachable: bool
    #: When the outage began (its controller's last answer before), UTC.
    since: datetime
    #: What does not answer: ``the Ray head at ray://head:10001``, ``the Slurm controller``.
    what: str
    executor: str
    error: str = ""
    #: When it ended (``reachable``), UTC.
    at: datetime | None = None


def record(database: Database, news: list[Outage], owner: str) -> None:
    """Outages begun or ended, as daemon ``owner`` saw them, stored as events."""
    if not news:
        return
    with database.session() as session:
        for outage in news:
            scheduling.add_event(
                session,
                kind="executor_reachable" if outage.reachable else "executor_unreachable",
                run_id=None,
                job_id=None,
                message=message(outage, owner),
                now=outage.at or outage.since,
            )


def message(outage: Outage, owner: str) -> str:
    """The stored event's message of ``outage`` as daemon ``owner`` saw it (JSON: ``evald status``)."""
    return json.dumps(
        {
            "executor": outage.executor,
            "what": outage.what,
            "since": outage.since.isoformat(),
            "at": None if outage.at is None else outage.at.isoformat(),
            "error": outage.error,
            "daemon": owner,
        }
    )


def mark_unknown(outage: Outage | None, attempts: Iterable[Attempt]) -> None:
    """While ``outage`` lasts, each job handed to the executor is in a state nobody knows: said so (since
    when, and the last state it had) in its state, which the bookkeeping stores."""
    if outage is None:
        return
    for attempt in attempts:
        known = attempt.state is None or not attempt.state.startswith(remote.UNKNOWN)
        if attempt.detached and attempt.handle is not None and known:
            attempt.state = remote.unknown_line(outage.since, outage.what, attempt.state)
