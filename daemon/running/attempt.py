"""One worker run of a claimed job, as plain data: its stages, the moves between them, and what its end
becomes (store, retry, rerun, requeue or fail).

A claim (the job's ``attempts``: its fencing token) runs one worker, or several when out-of-memory
reruns halve the batch size; each run is an :class:`Attempt`, with its own history row::

    CLAIMED ──► STARTED ──► RUNNING ──► ENDED
       │           │ ▲         │
       │           └─┘◄────────┘   (resubmitted; requeued by the scheduler)
       └────────────────────────────► ENDED   (a job folder or spec that cannot be made)

STARTED: handed to the executor (a worker process here, or ``sbatch``; the handle may still be unknown);
RUNNING: the executor says it runs; ENDED: it ended, was killed, fenced or left the daemon. Nothing here
does I/O: the runner moves attempts along and :func:`verdict` says what an end becomes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from daemon.config import Config
from daemon.errors import EvaldError
from daemon.running.executors.base import Executor, Handle, Placement
from daemon.running.retries import RetryPlan
from inference.spec import JobSpec
from storage.models import utcnow
from storage.queries import ClaimedJob

#: Outcome kinds of a scheduler's end that another attempt may cure.
SCHEDULER_RETRYABLE = frozenset({"timeout", "preempted", "node_fail", "lost"})

#: Failures another try may cure: a rank that died, a hung worker, and the scheduler's ends a retry may
#: cure (a preemption, a failed node, a job it forgot). A rejected input fails at once.
RETRYABLE = frozenset({"crash", "timeout"}) | SCHEDULER_RETRYABLE


class Stage(StrEnum):
    """Where a worker run is (see the module's diagram)."""

    CLAIMED = "claimed"
    STARTED = "started"
    RUNNING = "running"
    ENDED = "ended"


#: The moves an attempt may make.
TRANSITIONS: dict[Stage, frozenset[Stage]] = {
    Stage.CLAIMED: frozenset({Stage.STARTED, Stage.ENDED}),
    Stage.STARTED: frozenset({Stage.STARTED, Stage.RUNNING, Stage.ENDED}),
    Stage.RUNNING: frozenset({Stage.STARTED, Stage.RUNNING, Stage.ENDED}),
    Stage.ENDED: frozenset(),
}


class IllegalTransition(EvaldError):
    """A move :data:`TRANSITIONS` does not allow: a bug of the runner's, never an input's."""


def allowed(source: Stage, target: Stage) -> bool:
    return target in TRANSITIONS[source]


@dataclass
class Attempt:
    """One worker run of a claim, from its launch to its history row."""

    job: ClaimedJob
    spec: JobSpec
    #: The config the job was claimed under: a reload mid-job changes nothing for it.
    config: Config
    #: The executor it was handed to; None for a job adopted from a dead daemon whose worker had already
    #: finished.
    executor: Executor | None = None
    stage: Stage = Stage.CLAIMED
    #: When the job's first worker of this claim started: the timeout covers its out-of-memory reruns too.
    started: float = field(default_factory=time.monotonic)
    #: When this worker started (its history row).
    started_at: datetime = field(default_factory=utcnow)
    last_heartbeat: float = field(default_factory=time.monotonic)
    #: When the worker was seen to end: what the job's duration and history count, however late the
    #: database lets them be stored.
    ended: float | None = None
    ended_at: datetime | None = None
    #: Its history row is stored: a retry after an outage must not write it twice.
    recorded: bool = False
    #: The executor's handle; None while whether ``sbatch`` queued it is unknown (slurmctld did not
    #: answer): :meth:`Executor.find` is asked before submitting again.
    handle: Handle | None = None
    #: The handle is stored on the job (``executor_handle``).
    handle_recorded: bool = False
    #: When the executor is asked about it next (monotonic); a local worker is asked every pass.
    next_poll: float = 0.0
    #: Where the scheduler has it (``PENDING (Resources)``), and what of it is stored on the job.
    state: str | None = None
    state_recorded: str | None = None
    placement: Placement = field(default_factory=Placement)
    #: The scheduler's state it ended in (``COMPLETED``, ``TIMEOUT``, ...), for its history row.
    exit_state: str | None = None
    #: What the job's earlier attempts change for this one (time limit, nodes kept out, preemptions so
    #: far): a job handed to a scheduler has one; a local worker None.
    plan: RetryPlan | None = None
    #: The daemon whose claim this is a re-attachment to (:func:`~daemon.running.handover.reattach`),
    #: where its submission was still to be found by name; None for this daemon's own submission.
    taken_over: str | None = None

    @property
    def detached(self) -> bool:
        """Run by an executor whose jobs outlive the daemon (Slurm): polled every ``poll_secs``, its
        handle stored, left running at shutdown, re-attached to by the next daemon."""
        return self.executor is not None and self.executor.detached

    def move(self, target: Stage) -> None:
        if not allowed(self.stage, target):
            raise IllegalTransition(f"job {self.job.id}: {self.stage} → {target}")
        self.stage = target

    def finish(self) -> None:
        """The worker ended (or was stopped) now: what its duration and history row count."""
        self.move(Stage.ENDED)
        self.ended = time.monotonic()
        self.ended_at = utcnow()

    def duration(self) -> float:
        """Seconds since the claim's first worker started, up to this one's end."""
        return (self.ended or time.monotonic()) - self.started


class Verdict(StrEnum):
    """What the runner does with an attempt that ended without a result."""

    #: Its run left the config while it was queued: back to the queue for a daemon that has it.
    CANCEL_REQUEUE = "cancel_requeue"
    #: No room for its result: requeued without spending an attempt, and claiming pauses.
    DISK_FULL = "disk_full"
    #: Its checkpoint was deleted while it waited in the scheduler's queue.
    CANCEL_FAIL = "cancel_fail"
    #: Out of memory while the daemon stops: the next claim starts it again.
    REQUEUE = "requeue"
    #: Out of memory: run again at once with half the batch size.
    HALVE = "halve"
    #: Preempted (within ``free_preemptions`` in a row): back to the queue without spending an attempt.
    PREEMPTED = "preempted"
    #: Timed out at the most time a job may have: failed (another try would end alike).
    TIME_CAP = "time_cap"
    #: Back to the queue, the attempt spent.
    RETRY = "retry"
    FAIL = "fail"


def verdict(
    kind: str,
    *,
    batch_size: int,
    attempt: int,
    max_attempts: int,
    stopping: bool,
    detached: bool,
    preemptions: int = 0,
    free_preemptions: int = 0,
    at_time_cap: bool = False,
) -> Verdict:
    """What an end of kind ``kind`` (an :class:`Outcome` error kind) becomes. For a job handed to a
    scheduler: ``preemptions`` in a row before this end, of which ``free_preemptions`` spend no
    attempt, and whether it ran with the most time a job may have (``at_time_cap``)."""
    if kind == "run_removed":
        return Verdict.CANCEL_REQUEUE
    if kind == "disk_full":
        return Verdict.DISK_FULL
    if kind == "checkpoint_vanished" and detached:
        return Verdict.CANCEL_FAIL
    if kind == "out_of_memory" and batch_size > 1:
        return Verdict.REQUEUE if stopping else Verdict.HALVE
    if kind == "preempted" and detached and preemptions < free_preemptions:
        return Verdict.PREEMPTED
    if kind == "timeout" and detached and at_time_cap:
        return Verdict.TIME_CAP
    if kind in RETRYABLE and attempt < max_attempts:
        return Verdict.RETRY
    return Verdict.FAIL
