"""The executor contract: the daemon decides *what* to run, an executor decides *where*.

An executor is handed a job folder holding ``spec.json`` and runs the worker entry point
(``python -m inference.worker``, or a group of its ranks) somewhere that folder is visible; the worker
writes ``result.json`` (and ``result.rank<N>.json``, ``rank-<N>.log``) into it. Nothing else crosses:
the result files are the whole contract, wherever the worker ran. The executor only says whether the
worker is still waiting or running, and how it saw it end (:class:`Ended`): reading the result files
and deciding on a retry stay the runner's.

The protocol is small: :meth:`Executor.job_folder` says where a job's files go; :meth:`Executor.start`
(with the :class:`Adjustments` a job's earlier attempts call for: a longer time limit, failed nodes kept
out) returns a :class:`Handle`, which the runner records with the attempt before it moves on (where the job
outlives the daemon, :attr:`Executor.detached`); :meth:`Executor.poll` says :class:`Active` or
:class:`Ended`, for a handle of this executor or of an earlier daemon's (re-attaching after a restart);
:meth:`Executor.cancel`; and :meth:`Executor.find` finds a submission whose handle was never recorded.
One file per implementation: :mod:`.local` (worker processes here), :mod:`.slurm`. Every executor passes
tests/test_executor_contract.py.

A detached executor (:mod:`.slurm`, :mod:`.ray`) also :class:`ProbesFolders`: one tiny job tells whether
its nodes see ``job_dir`` and the other folders its workers read (:class:`SharedFolder`: an s3 run's
``[runs.s3] cache_dir``); the tokens it reads back are :mod:`.folder_probe`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from daemon.errors import EvaldError


class Phase(StrEnum):
    """Where a job that has not ended is."""

    #: Waiting in the scheduler's queue (``Active.reason`` says why: ``Resources``, ``Priority``, ...).
    PENDING = "pending"
    RUNNING = "running"
    #: Preempted or failed and put back in the queue by the scheduler: it will run again.
    REQUEUED = "requeued"
    #: Suspended or stopping (``COMPLETING``, ``SUSPENDED``, ``STOPPED``): neither waiting nor running.
    HELD = "held"


class EndKind(StrEnum):
    """How a job ended, as far as the executor can tell; the result files say the rest."""

    #: The worker exited 0 and wrote its result.
    SUCCEEDED = "succeeded"
    #: The worker exited non-zero (``Ended.exit_code``; its result file may hold the error).
    FAILED = "failed"
    #: Killed at the scheduler's time limit.
    TIMEOUT = "timeout"
    #: Preempted and not requeued.
    PREEMPTED = "preempted"
    #: A node of the job failed.
    NODE_FAIL = "node_fail"
    #: Killed for using more memory than it was given, or the worker reported running out of it.
    OUT_OF_MEMORY = "out_of_memory"
    #: Cancelled (``scancel``) by someone, or by evald itself.
    CANCELLED = "cancelled"
    #: The scheduler says no node of the cluster can ever run it as asked (a Ray placement group
    #: INFEASIBLE past ``infeasible_timeout_secs``): another attempt would ask the same, so none is made.
    INFEASIBLE = "infeasible"
    #: The scheduler no longer knows the job and it left no exit status: what happened is unknown.
    LOST = "lost"


#: Ends after which another attempt can help (the checkpoint and the task are not to blame).
RETRYABLE = frozenset(
    {EndKind.TIMEOUT, EndKind.PREEMPTED, EndKind.NODE_FAIL, EndKind.OUT_OF_MEMORY, EndKind.LOST}
)


@dataclass(frozen=True)
class JobRef:
    """The evald job an executor runs: named in the scheduler so that it can be found again."""

    job_id: int
    attempt: int
    run: str = ""
    task: str = ""


@dataclass(frozen=True)
class Adjustments:
    """What a job's earlier attempts change for its next submission (:mod:`daemon.running.retries`); an
    executor without a time limit or nodes to choose (the local one) has nothing to adjust."""

    #: The time limit in seconds, raised after a TIMEOUT; None: the configured one.
    time_limit_s: int | None = None
    #: Nodes that failed under an earlier attempt (scheduler node lists, ``node[1-2]``), kept out.
    exclude: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.time_limit_s is not None or bool(self.exclude)


#: The log key of a scheduler's job id, by executor (:meth:`Handle.logged`).
JOB_KEYS = {"slurm": "slurm_job_id", "ray": "ray_job", "local": "pid"}


@dataclass(frozen=True)
class Handle:
    """What the runner records with the attempt (``to_json``) to poll, cancel or re-attach later."""

    executor: str
    job_id: int
    attempt: int
    job_dir: Path
    #: The scheduler's id for it (a Slurm job id; a pid for the local executor).
    external_id: str

    def logged(self) -> dict[str, str]:
        """How a log line names the scheduler's job: under the key its executor's own events use
        (``slurm_job_id``, ``ray_job``; ``pid`` for a worker here), so that a Ray job is never called a
        Slurm one."""
        return {JOB_KEYS.get(self.executor, "executor_job"): self.external_id}

    def to_json(self) -> str:
        data = asdict(self)
        data["job_dir"] = str(self.job_dir)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Handle:
        data = json.loads(text)
        return cls(
            executor=str(data["executor"]),
            job_id=int(data["job_id"]),
            attempt=int(data["attempt"]),
            job_dir=Path(data["job_dir"]),
            external_id=str(data["external_id"]),
        )


@dataclass(frozen=True)
class Placement:
    """Attempt data from the scheduler: where and when (times are seconds since the epoch)."""

    state: str = ""
    nodes: str = ""
    partition: str = ""
    submitted: float | None = None
    started: float | None = None
    ended: float | None = None
    #: How often the scheduler requeued the job.
    restarts: int = 0

    @property
    def queue_wait_s(self) -> float | None:
        if self.submitted is None or self.started is None:
            return None
        return max(0.0, self.started - self.submitted)

    @property
    def run_s(self) -> float | None:
        if self.started is None or self.ended is None:
            return None
        return max(0.0, self.ended - self.started)


@dataclass(frozen=True)
class Active:
    """Not ended: pending (with the scheduler's reason), running, requeued or held."""

    phase: Phase
    reason: str | None = None
    placement: Placement = field(default_factory=Placement)


@dataclass(frozen=True)
class Ended:
    kind: EndKind
    #: One line for the attempt record: what the scheduler said (``TIMEOUT after 0:01:00 on node3``).
    detail: str
    #: The worker's exit status, where known (3: input rejected, 4: out of memory; see inference.spec).
    exit_code: int | None = None
    #: The end of the log of the rank that failed (or of the batch log), for FAILED and the like.
    log_tail: str = ""
    placement: Placement = field(default_factory=Placement)

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


Status = Active | Ended


class ExecutorError(EvaldError, RuntimeError):
    """A job could not be handed to the executor, and handing it again as it is would fail too (a bad
    partition, a job folder outside the shared one). The message names what is wrong."""


class ExecutorMisconfigured(ExecutorError):
    """The scheduler refused a job for what the config asks of it (a feature, GRES, account or QoS the
    cluster does not have): every job would be refused alike, so none is failed for it; jobs wait in
    evald's queue until the config (or the cluster) is fixed. The message names the setting."""


class ExecutorUnavailable(EvaldError, RuntimeError):
    """The executor cannot answer now (slurmctld restarting): nothing is known to have changed; ask
    again later."""


class Executor(Protocol):
    """Runs the worker of one job folder somewhere; see the module's docstring."""

    #: Its name in handles and the config (``local``, ``slurm``).
    kind: str
    #: Whether its jobs outlive the daemon (a scheduler's do; a worker process here does not): their
    #: handles are stored, a stopping daemon leaves them running and the next one re-attaches.
    detached: bool

    def job_folder(self, job: JobRef) -> Path:
        """Where the runner writes ``spec.json`` for ``job``."""
        ...

    def check(self) -> None:
        """Whether it can take jobs: :class:`ExecutorError` names what is wrong as configured,
        :class:`ExecutorUnavailable` says it cannot answer now."""
        ...

    def time_limits(self) -> tuple[int, int] | None:
        """(A job's first time limit, the most a TIMEOUT raises it to), in seconds, where the executor
        kills jobs at a time limit of its own (a scheduler's); None where the runner's clock does."""
        ...

    def start(self, spec_path: Path, job: JobRef, adjust: Adjustments | None = None) -> Handle:
        """Hand the job whose ``spec.json`` is ``spec_path`` over; returns once it is queued or started.
        :class:`ExecutorMisconfigured`: refused for the config's sake; :class:`ExecutorError`: for the
        job's."""
        ...

    def poll(self, handle: Handle) -> Status:
        """Where the job is now, or how it ended (for a handle an earlier daemon's executor made too)."""
        ...

    def cancel(self, handle: Handle) -> None:
        """Stop the job wherever it is (queued or running); a job already ended is left as it is."""
        ...

    def find(self, job: JobRef, since: float | None = None) -> Handle | None:
        """The handle of a submission for ``job`` that the executor still knows of, whose handle was
        never recorded (the daemon died between submitting and recording); None if there is none.
        ``since`` (seconds since the epoch): the claim's start; an ended submission older than that is
        an earlier claim's under the same number (one given back without spending an attempt)."""
        ...


@dataclass(frozen=True)
class SharedFolder:
    """A folder besides ``job_dir`` that the compute nodes must see (an s3 run's ``[runs.s3] cache_dir``:
    its workers load the copies downloaded there), and what it is in the config, for messages."""

    path: Path
    #: What names it: ``[runs.s3] cache_dir /x of run 'cloud'``.
    what: str


@runtime_checkable
class ProbesFolders(Protocol):
    """An executor whose jobs run on other nodes: a probe job tells whether they see ``job_dir`` and the
    folders given (the daemon's ``probe_job_dir``)."""

    def probe_job_dir(self, also: Sequence[SharedFolder] = ()) -> Handle:
        """Submit one job that reads back a token written into ``job_dir`` and into each of ``also``
        (made where missing); read its answer with :meth:`probe_result`."""
        ...

    def probe_result(self, probe: Handle) -> bool | None:
        """True once the job read every token back; None while it waits or runs; False where it was
        cancelled before it could tell; :class:`ExecutorError` naming each folder it could not read and
        where. The tokens in ``also`` are removed once it answers, whatever the answer."""
        ...


@runtime_checkable
class ReadsFolder(Protocol):
    """An executor whose job folder tells a job's success before its scheduler is asked (Slurm's
    ``exit.json``): the runner looks at every pass, and stores the result within a pass of its writing
    instead of at the next poll."""

    def ended_here(self, handle: Handle, last: Placement) -> Ended | None:
        """The job's success as its folder tells it now; None while it does not (running, or failed: how
        a job failed is the scheduler's to say). ``last``: where the last poll saw it."""
        ...
