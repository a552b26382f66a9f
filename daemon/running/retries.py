"""What a job's earlier attempts through a scheduler change for its next one: a pure policy over the
job's history rows (one per worker run, :class:`storage.queries.AttemptRow`).

- **TIMEOUT**: each one doubles the next attempt's time limit, up to the most it may have
  (``executor.max_time_limit``, default 4 × ``time_limit``, within the partition's MaxTime). A job that
  times out at that most fails at once: another try at the same limit would spend the same GPU time for
  the same end.
- **NODE_FAIL**: the nodes the attempt ran on are kept out of the job's next attempts (``--exclude``;
  the executor keeps them in only where the partition would be left with too few nodes for the job).
- **PREEMPTED**: the job goes back to evald's queue without spending an attempt, ``free_preemptions``
  times in a row. Past them each preemption spends an attempt like a failure, so a job preempted
  forever shows in ``evald status`` as retrying (kind ``preempted``) and then failed, with the count.

Counted over the whole history (a job given a new start keeps what its earlier runs taught), except
preemptions, which count in a row: any other end starts them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from daemon.config.executor import TIME_LIMIT_GROWTH, slurm_time
from daemon.running.executors.base import Adjustments
from storage.queries import AttemptRow

#: The scheduler state a history row of a run killed at its time limit carries.
TIMEOUT_STATE = "TIMEOUT"


@dataclass(frozen=True)
class RetryPlan:
    """What the claim's attempt runs under, from the job's history (see the module's docstring)."""

    #: The time limit of the job's first attempt, this attempt's, and the most it is raised to (seconds).
    base_time_limit_s: int
    time_limit_s: int
    max_time_limit_s: int
    #: Node lists of earlier attempts that ended NODE_FAIL, in order, each once.
    failed_nodes: tuple[str, ...] = ()
    #: Preemptions in a row just before this claim.
    preemptions: int = 0
    #: Earlier attempts killed at their time limit.
    timeouts: int = 0

    @property
    def at_time_cap(self) -> bool:
        """This attempt has the most time a job may have: a TIMEOUT now is the job's end."""
        return self.time_limit_s >= self.max_time_limit_s

    @property
    def next_time_limit_s(self) -> int:
        """The time limit the next attempt gets if this one times out."""
        return min(self.max_time_limit_s, self.time_limit_s * TIME_LIMIT_GROWTH)

    def adjustments(self) -> Adjustments:
        """What the executor submits differently from the config for this attempt."""
        raised = self.time_limit_s if self.time_limit_s != self.base_time_limit_s else None
        return Adjustments(time_limit_s=raised, exclude=self.failed_nodes)


def plan(history: Sequence[AttemptRow], *, time_limit_s: int, max_time_limit_s: int) -> RetryPlan:
    """The plan of a job's next attempt from its ``history`` (oldest first), its configured time limit
    and the most that may be raised to (both in seconds)."""
    most = max(time_limit_s, max_time_limit_s)
    timeouts = sum(1 for row in history if row.exit_state == TIMEOUT_STATE)
    limit = time_limit_s
    for _ in range(timeouts):
        limit = min(most, limit * TIME_LIMIT_GROWTH)
    failed = tuple(dict.fromkeys(row.nodes for row in history if row.error_kind == "node_fail" and row.nodes))
    preemptions = 0
    for row in reversed(history):
        if row.error_kind != "preempted":
            break
        preemptions += 1
    return RetryPlan(
        base_time_limit_s=time_limit_s,
        time_limit_s=limit,
        max_time_limit_s=most,
        failed_nodes=failed,
        preemptions=preemptions,
        timeouts=timeouts,
    )


def note(kind: str, retry: RetryPlan, *, nodes: str, free_preemptions: int, spent: bool, again: bool) -> str:
    """What the policy does after an end of ``kind`` under ``retry``, for its history row and the job's
    error: empty where it does nothing special. ``nodes``: where the attempt ran; ``spent``: whether
    the end spends an attempt; ``again``: whether the job runs again."""
    if kind == "timeout":
        if not again and retry.at_time_cap:
            return (
                f"timed out at {_clock(retry.time_limit_s)}, the most a job may have "
                "(executor.max_time_limit, default 4 × time_limit, within the partition's MaxTime): "
                "raise executor.max_time_limit, or make the task smaller"
            )
        if not again:
            return ""
        longer = retry.next_time_limit_s
        return f"the next attempt gets {_clock(longer)} (--time={slurm_time(longer)})"
    if kind == "node_fail" and nodes and again:
        return f"node(s) {nodes} are kept out of its next attempts (--exclude)"
    if kind == "preempted":
        count = retry.preemptions + 1
        if not spent:
            return (
                f"preemption {count} in a row: back in evald's queue without spending an attempt "
                f"({free_preemptions} in a row are free: executor.free_preemptions)"
            )
        return (
            f"preemption {count} in a row, past executor.free_preemptions = {free_preemptions}: "
            "it spends an attempt"
        )
    return ""


def _clock(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
