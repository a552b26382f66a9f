"""What ``evald status`` and ``/api/status`` say of each run, assembled from the stored rows as plain data."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from daemon.analysis.report.cells import jsonable
from storage.scheduling import HELD_PREFIX, PlanRow

if TYPE_CHECKING:
    from daemon.scheduling.resources import Check
    from storage.queries import AlternateRow, CheckpointRow, IgnoredRow, JobRow, ResultRow


def status(
    checkpoints: Sequence[CheckpointRow],
    jobs: Sequence[JobRow],
    runs: Sequence[str],
    plans: Sequence[PlanRow] = (),
    schedules: Mapping[str, Mapping[str, Any]] | None = None,
    max_attempts: int | None = None,
    ignored: Sequence[IgnoredRow] = (),
    alternates: Sequence[AlternateRow] = (),
    latest: Sequence[ResultRow] = (),
) -> dict[str, Any]:
    """Per run: counts by state, the frequency and when the next checkpoint is due, the queue by
    priority, every deferred job, waiting and skipped checkpoint with its reason, and every job that is
    being retried or failed with its attempts (of ``max_attempts``) and its last error; the folders
    discovery did not take, with why, and the other shapes of evaluated steps (alternates); the metrics
    whose newest result (of ``latest``) was computed over no samples."""
    out: dict[str, Any] = {}
    for run in runs:
        run_checkpoints = [c for c in checkpoints if c.run == run]
        run_jobs = [j for j in jobs if j.run == run]
        out[run] = {
            **_progress(run_checkpoints, run_jobs, (schedules or {}).get(run, {})),
            **_jobs_under_way(run_jobs, max_attempts),
            **_checkpoints_held_back(run_checkpoints, [p for p in plans if p.run == run]),
            **_problems(run_checkpoints, run_jobs, max_attempts),
            **_findings(
                run_jobs,
                [r for r in latest if r.run == run],
                [i for i in ignored if i.run == run],
                [a for a in alternates if a.run == run],
            ),
        }
    return out


def _progress(
    checkpoints: Sequence[CheckpointRow], jobs: Sequence[JobRow], schedule: Mapping[str, Any]
) -> dict[str, Any]:
    """How far a run is: counts by state, its newest evaluated step, its schedule, its queue."""
    return {
        "checkpoints": _count(c.state for c in checkpoints),
        "jobs": _count(j.state for j in jobs),
        "last_evaluated_step": max(
            (j.step for j in jobs if j.state == "succeeded" and j.step is not None), default=None
        ),
        "schedule": {k: _jsonable_deep(v) for k, v in schedule.items()},
        "queue": _queue(jobs),
    }


def _jobs_under_way(jobs: Sequence[JobRow], max_attempts: int | None) -> dict[str, Any]:
    """A run's jobs that are running, deferred, held back or being retried."""
    return {
        "running": [
            {
                "job": j.id,
                "step": j.step,
                "task": j.task,
                "stage": j.stage,
                "attempt": j.attempts,
                "max_attempts": max_attempts,
                "held_by": j.claimed_by,
                "started_at": jsonable(j.started_at),
                "heartbeat_at": jsonable(j.heartbeat_at),
            }
            for j in jobs
            if j.state == "running"
        ],
        "deferred": [_waiting_job(j) for j in jobs if j.state == "deferred"],
        # Queued jobs the dispatcher holds back, with why (``max_queued_per_run`` reached); a pending
        # job's other reason is a deferral's, kept from before it was released, and said no more.
        "held": [
            _waiting_job(j)
            for j in jobs
            if j.state == "pending" and j.wait_reason and j.wait_reason.startswith(HELD_PREFIX)
        ],
        # Jobs whose last attempt failed and that will run again: the retry queue is the database.
        "retrying": [
            {
                "job": j.id,
                "step": j.step,
                "task": j.task,
                "stage": j.stage,
                "state": j.state,
                "attempts": j.attempts,
                "max_attempts": max_attempts,
                "kind": j.error_kind,
                "error": j.error,
            }
            for j in jobs
            if j.state in RETRYING_STATES and j.attempts > 0 and j.error is not None
        ],
    }


def _waiting_job(job: JobRow) -> dict[str, Any]:
    return {"job": job.id, "step": job.step, "task": job.task, "stage": job.stage, "reason": job.wait_reason}


def _checkpoints_held_back(checkpoints: Sequence[CheckpointRow], plans: Sequence[PlanRow]) -> dict[str, Any]:
    """A run's checkpoints not evaluated yet, with why: not ready, waiting for their turn, or skipped."""
    return {
        # Still being written, or incomplete until invalid_after_secs: newer ones are not held back.
        "not_ready": [
            {"checkpoint": c.name, "step": c.step, "reason": c.reason}
            for c in checkpoints
            if c.state == "discovered"
        ],
        "waiting": [_plan(p) for p in plans if p.plan == "waiting"],
        "skipped": [_plan(p) for p in plans if p.plan == "skipped"],
    }


def _problems(
    checkpoints: Sequence[CheckpointRow], jobs: Sequence[JobRow], max_attempts: int | None
) -> dict[str, Any]:
    """A run's checkpoints found invalid or gone, and its jobs that failed for good."""
    return {
        "problems": [
            {"checkpoint": c.name, "step": c.step, "state": c.state, "reason": c.reason}
            for c in checkpoints
            if c.state in ("invalid", "vanished")
        ]
        + [
            {
                "checkpoint": j.checkpoint,
                "step": j.step,
                "task": j.task,
                "state": j.state,
                "reason": j.error,
                "job": j.id,
                "kind": j.error_kind,
                "attempts": j.attempts,
                "max_attempts": max_attempts,
            }
            for j in jobs
            if j.state == "failed"
        ],
    }


def _findings(
    jobs: Sequence[JobRow],
    latest: Sequence[ResultRow],
    ignored: Sequence[IgnoredRow],
    alternates: Sequence[AlternateRow],
) -> dict[str, Any]:
    """What a run's evaluations and discovery noticed on the way: tensor-parallel ranks that disagreed,
    inputs left out, metrics over no samples, folders not taken, other shapes of evaluated steps."""
    return {
        "tp_disagreements": [
            {"job": j.id, "step": j.step, "task": j.task, "batches": j.tp_disagreements}
            for j in jobs
            if j.tp_disagreements
        ],
        "left_out": [
            {"job": j.id, "step": j.step, "task": j.task, "stage": j.stage, "inputs": j.problems}
            for j in jobs
            if j.problems
        ],
        "no_samples": [
            {"step": r.step, "checkpoint": r.checkpoint, "task": r.task, "stage": r.stage, "metric": r.metric}
            for r in latest
            if r.no_samples
        ],
        "ignored": [{"folder": i.name, "reason": i.reason} for i in ignored],
        "alternates": [{"folder": a.name, "layout": a.layout, "of": a.of} for a in alternates],
    }


#: States of a job that runs again after a failed attempt (its error stays until it succeeds).
RETRYING_STATES = ("pending", "deferred", "running")


def _jsonable_deep(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _jsonable_deep(v) for k, v in value.items()}
    return jsonable(value)


def _plan(row: PlanRow) -> dict[str, Any]:
    return {"checkpoint": row.checkpoint, "step": row.step, "reason": row.reason}


def _queue(jobs: Sequence[JobRow]) -> list[dict[str, Any]]:
    """Jobs waiting to run, grouped by priority (highest, which runs first, first)."""
    groups: dict[tuple[int, str], list[JobRow]] = {}
    for job in jobs:
        if job.state == "pending":
            groups.setdefault((job.priority, job.stage), []).append(job)
    return [
        {
            "priority": priority,
            "stage": stage,
            "jobs": len(group),
            "steps": sorted({j.step for j in group if j.step is not None}, reverse=True),
        }
        for (priority, stage), group in sorted(groups.items(), key=lambda item: (-item[0][0], item[0][1]))
    ]


def _count(states: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return dict(sorted(counts.items()))


def resources(check: Check | None) -> dict[str, Any] | None:
    if check is None:
        return None
    return {"met": check.met, "unmet": list(check.unmet), "not_applicable": list(check.not_applicable)}


def with_scheduler(
    runs: Mapping[str, Any],
    states: Mapping[int, tuple[str | None, str | None]],
    now: datetime | None = None,
) -> dict[str, Any]:
    """``status``'s summary with each running job's scheduler job id and state (``PENDING
    (Resources)``) where it was handed to Slurm or Ray, whether it waits in that queue, runs there, or is
    in a state nobody knows since its controller stopped answering; while it waits, how long it has so far
    (``now`` less its claim, which submitted it), and since when its state is unknown. Per run,
    ``slurm``: its jobs pending there (by the scheduler's reason), running and unknown. ``states``: job
    id → (stored handle, state)."""
    out: dict[str, Any] = {}
    for run, info in runs.items():
        running = [
            _scheduled(job, states.get(job["job"], (None, None)), now) for job in info.get("running", [])
        ]
        handed = [j for j in running if "in_slurm" in j]
        shown = {**info, "running": running}
        if handed:
            shown["slurm"] = _queue_counts(handed)
        out[run] = shown
    return out


def _scheduled(
    job: Mapping[str, Any], stored: tuple[str | None, str | None], now: datetime | None
) -> dict[str, Any]:
    """A running job as its scheduler has it (``job`` as it is where it was never handed to one)."""
    handle, state = stored
    if handle is None:
        return dict(job)
    external_id = None
    executor = "slurm"
    try:
        recorded = json.loads(handle)
        external_id = recorded.get("external_id")
        executor = str(recorded.get("executor") or executor)
    except (ValueError, AttributeError):
        external_id = None
    where, reason = scheduler_phase(state)
    since = unknown_since(state) if where == "unknown" else None
    return {
        **job,
        "slurm_job_id": external_id,
        "scheduler_state": state,
        "in_slurm": where,
        # The keys keep Slurm's name (the first remote executor); this says whose queue it is.
        "executor": executor,
        "reason": reason,
        "queue_wait_s": _since(job.get("started_at"), now) if where == "pending" else None,
        "unknown_since": since,
        "unknown_for_s": _since(since, now),
    }


def _queue_counts(handed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A run's jobs in the scheduler's hands: pending (by reason), running, and of unknown state."""
    reasons: dict[str, int] = {}
    for job in handed:
        if job["in_slurm"] == "pending":
            reason = job["reason"] or "submitted"
            reasons[reason] = reasons.get(reason, 0) + 1
    pending = sum(reasons.values())
    unknown = sum(1 for j in handed if j["in_slurm"] == "unknown")
    return {
        "pending": pending,
        "running": len(handed) - pending - unknown,
        "unknown": unknown,
        "executor": handed[0]["executor"],
        "reasons": dict(sorted(reasons.items(), key=lambda item: (-item[1], item[0]))),
    }


#: Slurm states in which a job waits for its nodes (``squeue``'s words; a requeued job waits again).
WAITING_STATES = frozenset(
    {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
)


#: A stored state while the scheduler's controller does not answer (daemon.running.remote.unknown_line):
#: ``UNKNOWN since 2026-05-01T10:00:00Z (the Ray head at … does not answer; last RUNNING on a)``.
_UNKNOWN = re.compile(r"^UNKNOWN since (\S+) \((.*)\)$", re.DOTALL)


def scheduler_phase(state: str | None) -> tuple[str, str | None]:
    """``pending``, ``running`` or ``unknown`` from a stored scheduler state (``PENDING (Resources)``,
    ``RUNNING on node1``, ``UNKNOWN since … (…)``), and the reason in brackets, if any. No state yet
    (submitted, not polled since) counts as pending: it has not started anywhere that evald knows of."""
    if not state:
        return "pending", None
    unknown = _UNKNOWN.match(state.strip())
    if unknown:
        return "unknown", unknown.group(2)
    word, _, rest = state.strip().partition(" ")
    reason = rest.strip()[1:-1] if rest.strip().startswith("(") and rest.strip().endswith(")") else None
    return ("pending" if word.upper() in WAITING_STATES else "running"), reason or None


def unknown_since(state: str | None) -> str | None:
    """When the job's state became unknown (ISO 8601, UTC), from a stored ``UNKNOWN since …`` state."""
    unknown = _UNKNOWN.match((state or "").strip())
    return unknown.group(1).replace("Z", "+00:00") if unknown else None


def _since(started: str | None, now: datetime | None) -> float | None:
    if started is None or now is None:
        return None
    began = datetime.fromisoformat(started)
    if began.tzinfo is None or now.tzinfo is None:
        began, now = began.replace(tzinfo=None), now.replace(tzinfo=None)
    return round(max(0.0, (now - began).total_seconds()), 1)
