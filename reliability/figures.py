"""What a scenario measured, counted from the database, the job folders and the webhook receiver.

The counters (RELIABILITY.md defines them for readers):

- ``written``: checkpoints the writer finished (the trainer's ``trainer.saved`` lines, or the folders a
  scenario wrote).
- ``due``: written checkpoints the frequency policy asks for (every one, unless the scenario sets
  ``freq_steps``; then the steps it names), each needing one job per task.
- ``evaluated``: due checkpoints with a ``succeeded`` job for every task.
- ``failed_expected``: due checkpoints whose job failed for a reason the scenario caused on purpose (the
  checkpoint deleted mid-load), listed by the scenario.
- ``lost``: due checkpoints neither evaluated nor failed as expected.
- ``duplicated``: a (checkpoint, task, stage) with more than one job, a metric stored more than once for
  it, or a job with more than one ``succeeded`` attempt in ``job_attempts``.
- ``recomputed``: worker runs that wrote a whole result which was not the one stored (a daemon killed
  after its worker finished, before the result was committed): wasted work, not a duplicate.
- ``alerts fired``: notifications queued in the outbox (one per alert event and endpoint).
- ``alerts delivered``: distinct ``webhook-id``\\ s the receiver accepted (verified, answered 2xx).
- ``alerts disabled``: notifications not sent because the endpoint answered 410 Gone (by design).
- ``alerts lost``: notifications neither delivered nor disabled by a 410.
- ``alerts duplicated``: a ``webhook-id`` the receiver accepted again after an answer the sender got
  (a re-send after a request the receiver held past the sender's timeout is counted apart, as
  ``alerts resent``: Standard Webhooks' at-least-once, dropped by the id).
- ``poison``: bad items a scenario put beside the good checkpoints (a folder whose step does not fit,
  a symlink loop, a task whose metric names collide), then in brackets those ``unrefused`` (a poison
  checkpoint evaluated or left undecided instead of ``invalid``, a poison job not ``failed`` naming what
  is wrong) and ``misnamed`` (no daemon log line names it, or one daemon start names it in more than one
  line: a retry from memory).
- ``late``: due checkpoints evaluated, but more than the scenario's bound after they were written.
- ``discarded``: results a daemon computed and then threw away because it had lost the job's lease
  (``job.lost_lease`` lines): the work was done twice or not stored.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select

from daemon.delivery.receiver import Attempt
from storage.database import Database
from storage.models import (
    Checkpoint,
    EvalJob,
    JobAttempt,
    JobState,
    OutboxMessage,
    OutboxState,
    Result,
    Run,
)


@dataclass
class Figures:
    scenario: str
    #: The faults injected, e.g. ``{"daemon SIGKILL": 12, "worker SIGKILL": 8}``.
    faults: dict[str, int] = field(default_factory=dict)
    written: int = 0
    due: int = 0
    evaluated: int = 0
    failed_expected: int = 0
    lost: int = 0
    duplicated: int = 0
    recomputed: int = 0
    alerts_fired: int = 0
    alerts_delivered: int = 0
    alerts_disabled: int = 0
    alerts_lost: int = 0
    alerts_duplicated: int = 0
    alerts_resent: int = 0
    #: Daemon exits nobody asked for (a crash), and starts in all.
    daemon_crashes: int = 0
    daemon_starts: int = 0
    #: Whether a daemon exit the scenario did not cause fails it (a restart by the supervisor is allowed
    #: where the issue allows it: "alive, or restarted by its supervisor").
    crashes_allowed: bool = False
    #: Checkpoints whose job started before the writer's last write.
    read_early: int = 0
    #: Faults with no log line naming them.
    faults_unlogged: int = 0
    #: Poison items put beside the good checkpoints; those not refused as they should be; those no log
    #: line names, or that one daemon start names more than once.
    poison: int = 0
    poison_unrefused: int = 0
    poison_misnamed: int = 0
    #: Due checkpoints evaluated later than the scenario's bound after they were written.
    late: int = 0
    #: ``job.lost_lease`` lines: results computed and thrown away by a daemon that lost the lease.
    discarded: int = 0
    #: Places a configured secret showed up (log line, status file, CLI output, a worker's environment).
    secret_leaks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    lost_detail: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.lost == 0
            and self.duplicated == 0
            and self.alerts_lost == 0
            and self.alerts_duplicated == 0
            and (self.crashes_allowed or self.daemon_crashes == 0)
            and self.read_early == 0
            and self.faults_unlogged == 0
            and self.poison_unrefused == 0
            and self.poison_misnamed == 0
            and self.late == 0
            and self.discarded == 0
            and not self.secret_leaks
        )

    def as_dict(self) -> dict[str, object]:
        return {**self.__dict__, "passed": self.passed}


@dataclass(frozen=True)
class Expected:
    """What a scenario asked for: checkpoints due (``RUN/NAME``, the name being the folder's path under
    the run root), tasks each, and those whose failure it caused."""

    due: frozenset[str]
    tasks: tuple[str, ...]
    fail_ok: frozenset[str] = frozenset()


def count_results(figures: Figures, database: Database, expected: Expected, state_dir: Path) -> None:
    """Fill the checkpoint counters of ``figures`` from the database and the job folders."""
    with database.session() as session:
        rows = session.execute(
            select(EvalJob.id, Run.name + "/" + Checkpoint.name, EvalJob.task, EvalJob.stage, EvalJob.state)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .join(Run, Checkpoint.run_id == Run.id)
        ).all()
        results = session.execute(
            select(Run.name + "/" + Checkpoint.name, EvalJob.task, EvalJob.stage, Result.metric)
            .join(EvalJob, Result.job_id == EvalJob.id)
            .join(Checkpoint, EvalJob.checkpoint_id == Checkpoint.id)
            .join(Run, Checkpoint.run_id == Run.id)
        ).all()
        succeeded_attempts = Counter(
            session.scalars(select(JobAttempt.job_id).where(JobAttempt.outcome == "succeeded")).all()
        )
    jobs_per_key = Counter((name, task, stage) for _, name, task, stage, _ in rows)
    stored = Counter(tuple(r) for r in results)
    duplicated = sum(n - 1 for n in jobs_per_key.values() if n > 1)
    duplicated += sum(n - 1 for n in stored.values() if n > 1)
    duplicated += sum(n - 1 for n in succeeded_attempts.values() if n > 1)
    figures.duplicated = duplicated

    states: dict[str, dict[str, set[JobState]]] = {}
    for _, name, task, _, state in rows:
        states.setdefault(name, {}).setdefault(task, set()).add(state)
    figures.due = len(expected.due)
    for name in sorted(expected.due):
        per_task = states.get(name, {})
        if all(JobState.SUCCEEDED in per_task.get(t, set()) for t in expected.tasks):
            figures.evaluated += 1
        elif name in expected.fail_ok and all(
            per_task.get(t, set()) & {JobState.FAILED, JobState.SUCCEEDED} for t in expected.tasks
        ):
            figures.failed_expected += 1
        else:
            figures.lost += 1
            seen = {t: sorted(s.value for s in v) for t, v in per_task.items()}
            figures.lost_detail.append(f"{name}: {seen or 'no job'}")
    figures.recomputed = recomputed(state_dir, {job_id for job_id, *_ in rows})


def recomputed(state_dir: Path, job_ids: Iterable[int]) -> int:
    """Whole results written by a worker beyond one per job (``jobs/ID-ATTEMPT*/result.json``)."""
    per_job: Counter[int] = Counter()
    for result in (state_dir / "jobs").glob("*/result.json"):
        try:
            json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        per_job[int(result.parent.name.split("-")[0])] += 1
    known = set(job_ids)
    return sum(n - 1 for job, n in per_job.items() if job in known and n > 1)


def count_alerts(figures: Figures, database: Database, attempts: Sequence[Attempt]) -> None:
    """Fill the alert counters from the outbox and what the receiver saw."""
    with database.session() as session:
        outbox = session.execute(select(OutboxMessage.event_id, OutboxMessage.state)).all()
    accepted = [a for a in attempts if a.error is None and a.status < 300 and a.webhook_id is not None]
    delivered = {a.webhook_id for a in accepted}
    figures.alerts_fired = len(outbox)
    figures.alerts_delivered = len(delivered & {event_id for event_id, _ in outbox})
    figures.alerts_disabled = sum(
        1 for event_id, state in outbox if state == OutboxState.DISABLED and event_id not in delivered
    )
    figures.alerts_lost = sum(
        1 for event_id, state in outbox if event_id not in delivered and state != OutboxState.DISABLED
    )
    # In arrival order: an id accepted before counts as a duplicate unless that earlier answer was held
    # past the sender's timeout (the sender never saw it, so its re-send is expected).
    answered: set[str] = set()
    held: set[str] = set()
    for attempt in sorted(accepted, key=lambda a: a.received_at):
        webhook_id = attempt.webhook_id
        assert webhook_id is not None
        if webhook_id in answered:
            figures.alerts_duplicated += 1
        elif webhook_id in held:
            figures.alerts_resent += 1
        if attempt.delay_s > 0:
            held.add(webhook_id)
        else:
            answered.add(webhook_id)


def render_table(rows: Sequence[Figures]) -> str:
    """A markdown table: one row per scenario."""
    head = (
        "| scenario | faults | written | due | evaluated | lost | duplicated | recomputed "
        "| alerts fired | delivered | disabled (410) | lost | duplicated | resent | crashes | unlogged "
        "| poison (unrefused, misnamed) | late | discarded | secrets | s | verdict |"
    )
    lines = [head, "|" + "---|" * (len(head.split("|")) - 2)]
    for f in rows:
        faults = ", ".join(f"{k} ×{v}" for k, v in f.faults.items()) or "-"
        cells = [
            f.scenario,
            faults,
            f.written,
            f.due,
            f.evaluated + f.failed_expected,
            f.lost,
            f.duplicated,
            f.recomputed,
            f.alerts_fired,
            f.alerts_delivered,
            f.alerts_disabled,
            f.alerts_lost,
            f.alerts_duplicated,
            f.alerts_resent,
            f.daemon_crashes,
            f.faults_unlogged,
            f"{f.poison} ({f.poison_unrefused}, {f.poison_misnamed})" if f.poison else "-",
            f.late,
            f.discarded,
            len(f.secret_leaks),
            round(f.seconds),
            "pass" if f.passed else "FAIL",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
