"""A run's planning policy over plain data: the triggers in force, and the planner's pure decisions.

What ``evald status`` shows of a run's frequency, how a checkpoint that became ready late is judged, how
long a run must be quiet to count as finished, and which jobs a due checkpoint gets. No database, no
clock: :mod:`daemon.scheduling.planner` reads what these need, and writes what they decide.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from daemon.config import RunConfig, SchedulingConfig, TwoStageConfig
from daemon.scheduling import frequency, stages
from daemon.watching.runs import WatchedRun
from storage import scheduling as store

#: A run counts as finished once quiet for this many of its usual gaps between checkpoints (and at least
#: ``final_after_secs``): a slow run's every checkpoint must not count as its last.
QUIET_GAPS = 3


@dataclass(frozen=True)
class RunPolicy:
    watched: WatchedRun
    triggers: frequency.Frequency
    backlog: str

    @property
    def config(self) -> RunConfig:
        return self.watched.config

    @property
    def name(self) -> str:
        return self.watched.config.name

    @property
    def run_id(self) -> int:
        return self.watched.run_id

    def is_base(self, candidate: store.PlanCandidate) -> bool:
        base = self.config.base_model
        return self.config.eval_before_train and base is not None and candidate.path == str(base)

    def is_final(self, step: int | None) -> bool:
        final_step = self.config.final_step
        return final_step is not None and step is not None and step >= final_step

    def effective(self, schedule: store.Schedule) -> frequency.Frequency:
        """The frequency in force: adaptive runs replace ``freq_steps`` by their current interval."""
        if self.config.adaptive is None:
            return self.triggers
        every = schedule.every_steps or self.triggers.steps or self.config.adaptive.min_every_steps
        return frequency.Frequency(steps=every, epochs=self.triggers.epochs, secs=self.triggers.secs)


def anchor(schedule: store.Schedule) -> frequency.Anchor:
    """Where the run's last evaluation left its counters."""
    return frequency.Anchor(schedule.anchor_step, schedule.anchor_epoch, schedule.anchor_at)


def schedule_summary(
    scheduling: SchedulingConfig, run: RunConfig, schedule: store.Schedule
) -> dict[str, Any]:
    """What ``evald status`` says about a run's frequency: the triggers, the next due point, and the
    adaptive interval with its reason."""
    policy = RunPolicy(
        WatchedRun(run, schedule.run_id, ()), scheduling.frequency_for(run), scheduling.backlog_for(run)
    )
    effective = policy.effective(schedule)
    summary: dict[str, Any] = {
        "frequency": effective.describe(),
        "backlog": policy.backlog,
        "next_due": frequency.next_due(effective, anchor(schedule)),
        "last_reset": {
            "step": schedule.anchor_step,
            "epoch": schedule.anchor_epoch,
            "at": schedule.anchor_at,
        },
        "evaluated_checkpoints": schedule.evaluated,
    }
    if run.adaptive is not None:
        summary["adaptive"] = {
            "every_steps": effective.steps,
            "reason": schedule.every_reason or "no movement measured yet: the starting interval",
        }
    return summary


def late_refusal(policy: RunPolicy, schedule: store.Schedule) -> str | None:
    """Why a checkpoint that became ready after a newer one was planned is skipped whatever its step,
    or ``None`` when its step decides (:func:`judge_late`)."""
    newest = schedule.anchor_step
    triggers = policy.effective(schedule)
    if policy.backlog == "newest_only":
        return f"not due: ready after step {newest} was planned (backlog = newest_only takes the newest)"
    if not triggers.every_checkpoint and triggers.steps is None and triggers.epochs is None:
        return f"not due: ready after step {newest} was planned (the time trigger takes the newest)"
    return None


def judge_late(
    policy: RunPolicy,
    schedule: store.Schedule,
    *,
    step: int,
    epoch: int | None,
    before: tuple[int, int | None] | None,
    now: datetime,
) -> tuple[bool, str]:
    """(due, reason) of a late checkpoint, by its step and epoch against ``before``, the evaluated
    checkpoint before it (step, epoch), as it would have been judged in step order. The time trigger takes
    only the newest, so it plays no part here."""
    newest = schedule.anchor_step
    triggers = policy.effective(schedule)
    start = frequency.Anchor(step=0, epoch=0, at=now)
    if before is not None:
        before_epoch = frequency.epoch_of(*before, policy.config.steps_per_epoch)
        start = frequency.Anchor(step=before[0], epoch=before_epoch or 0, at=now)
    decision = frequency.decide(
        dataclasses.replace(triggers, secs=None), start, step=step, epoch=epoch, now=now
    )
    if decision.verdict is frequency.Verdict.DUE:
        return True, f"ready after step {newest} was planned: {decision.reason}"
    shown = decision.reason.removeprefix("not due: ")
    return False, f"not due: ready after step {newest} was planned: {shown}"


def quiet_limit(final_after_secs: float, planned: Sequence[datetime]) -> timedelta:
    """How long a run must be quiet to count as finished: ``final_after_secs``, or ``QUIET_GAPS`` times
    its median gap between recent checkpoints (``planned``, oldest first) when that is longer."""
    limit = final_after_secs
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(planned)]
    if gaps:
        limit = max(limit, QUIET_GAPS * statistics.median(gaps))
    return timedelta(seconds=limit)


@dataclass(frozen=True)
class Batch:
    """Jobs of a due checkpoint queued together: its tasks at one stage and priority."""

    tasks: tuple[str, ...]
    stage: str
    priority: int
    #: Why a full stage is queued beside the quick one (said when it queues a job); ``None`` otherwise.
    full_because: str | None = None


def batches(
    tasks: Sequence[str], two_stage: Mapping[str, TwoStageConfig], sequence: int, final: str | None
) -> list[Batch]:
    """The jobs a due checkpoint gets, in the order they are queued: its single-stage tasks in full, then
    each two-stage task's quick stage, and its full stage every ``full_every`` evaluated checkpoints
    (this one is number ``sequence``) or when ``final`` says it is the run's last."""
    found = [Batch(tuple(t for t in tasks if t not in two_stage), stages.FULL, stages.PRIORITY_QUICK)]
    for task in tasks:
        if task not in two_stage:
            continue
        found.append(Batch((task,), stages.QUICK, stages.PRIORITY_QUICK))
        why = final or (
            f"every {two_stage[task].full_every} evaluated checkpoints (this is number {sequence})"
            if stages.full_by_count(sequence, two_stage[task].full_every)
            else None
        )
        if why is not None:
            found.append(Batch((task,), stages.FULL, stages.PRIORITY_FULL, why))
    return found
