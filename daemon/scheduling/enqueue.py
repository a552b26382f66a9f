"""Queues the jobs the planner decided on: a due checkpoint's batches, and a task's full stage.

The writes behind :func:`daemon.scheduling.policy.batches`; shared by planning, the time trigger, the end
of a quiet run and the follow-ups of a result (:mod:`daemon.scheduling.followups`).
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog
from sqlalchemy.orm import Session

from daemon.config import TwoStageConfig
from daemon.scheduling import stages
from daemon.scheduling.policy import RunPolicy, batches
from storage import queries
from storage import scheduling as store

log = structlog.get_logger("evald.planner")


def enqueue(
    session: Session,
    policy: RunPolicy,
    candidate: store.PlanCandidate,
    two_stage: Mapping[str, TwoStageConfig],
    sequence: int,
    final: str | None,
) -> int:
    """Queue a due checkpoint's jobs; returns how many were created."""
    created = 0
    for batch in batches(policy.watched.tasks, two_stage, sequence, final):
        if batch.full_because is not None:
            created += enqueue_full(
                session, policy, candidate.id, candidate.step, batch.tasks[0], batch.full_because
            )
            continue
        created += queries.enqueue_jobs(
            session,
            checkpoint_id=candidate.id,
            step=candidate.step,
            tasks=list(batch.tasks),
            stage=batch.stage,
            priority=batch.priority,
        )
    return created


def enqueue_full(
    session: Session, policy: RunPolicy, checkpoint_id: int, step: int | None, task: str, why: str
) -> int:
    """Queue one task's full stage of a checkpoint, saying why when it is new."""
    created = queries.enqueue_jobs(
        session,
        checkpoint_id=checkpoint_id,
        step=step,
        tasks=[task],
        stage=stages.FULL,
        priority=stages.PRIORITY_FULL,
    )
    if created:
        log.info("stage.full_queued", run=policy.name, step=step, task=task, reason=why)
    return created
