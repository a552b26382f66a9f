"""Typed SQLAlchemy models: the database is the single source of truth.

The exactly-once rules are constraints, not conventions: one job per checkpoint × task × stage, one
result per job × metric, one sample row per job × index. Code that breaks them fails loudly.
"""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import JSON, Boolean, Enum, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Defined with the core types, where the reads that do without the ORM find them too; named here as well.
from storage.column_types import MetricFloat as MetricFloat
from storage.column_types import UTCDateTime as UTCDateTime
from storage.column_types import utcnow as utcnow


class CheckpointState(enum.StrEnum):
    DISCOVERED = "discovered"
    READY = "ready"
    INVALID = "invalid"
    VANISHED = "vanished"


class JobState(enum.StrEnum):
    PENDING = "pending"
    DEFERRED = "deferred"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: Superseded before it ran (backlog ``newest_only``): never runs.
    SKIPPED = "skipped"


TERMINAL_JOB_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.SKIPPED)


class Plan(enum.StrEnum):
    """What the frequency policy made of a ready checkpoint."""

    DUE = "due"
    SKIPPED = "skipped"
    #: Not due by step or epoch; the time trigger takes it if it is still the newest at the next tick.
    WAITING = "waiting"


def _enum(cls: type[enum.StrEnum], name: str) -> Enum:
    # Stored as plain strings with a CHECK constraint: readable from any SQL client, portable to SQLite.
    return Enum(cls, name=name, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime()}  # noqa: RUF012 (SQLAlchemy's own hook)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    root: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    checkpoints: Mapped[list[Checkpoint]] = relationship(back_populates="run")


class RunSchedule(Base):
    """A run's frequency state: what the last evaluation reset. Kept here so restarts neither repeat nor
    skip a checkpoint."""

    __tablename__ = "run_schedules"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    anchor_step: Mapped[int] = mapped_column(Integer, default=0)
    anchor_epoch: Mapped[int] = mapped_column(Integer, default=0)
    anchor_at: Mapped[datetime]
    #: How many checkpoints the policy has called due (two-stage counts its n-th by it).
    evaluated: Mapped[int] = mapped_column(Integer, default=0)
    #: Adaptive frequency: the interval now in force, and why.
    every_steps: Mapped[int | None] = mapped_column(Integer)
    every_reason: Mapped[str | None] = mapped_column(Text)
    #: When a daemon last started one of the run's jobs: runs take turns by it.
    last_claimed_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class Event(Base):
    """Something an operator should hear about (a job stuck in deferral); alerts are built from these."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(primary_key=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    kind: Mapped[str] = mapped_column(String(32))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("eval_jobs.id", ondelete="CASCADE"))
    message: Mapped[str] = mapped_column(Text)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (
        UniqueConstraint("run_id", "path", name="uq_checkpoints_run_path"),
        # A run's checkpoints by step: the API's step ranges, one step's metrics, the newest evaluated step.
        Index("ix_checkpoints_run_step", "run_id", "step"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(String(500))
    step: Mapped[int | None] = mapped_column(Integer)
    epoch: Mapped[int | None] = mapped_column(Integer)
    layout: Mapped[str] = mapped_column(String(32))
    state: Mapped[CheckpointState] = mapped_column(_enum(CheckpointState, "checkpoint_state"))
    reason: Mapped[str | None] = mapped_column(Text)
    discovered_at: Mapped[datetime] = mapped_column(default=utcnow)
    ready_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    #: The frequency policy's verdict on a ready checkpoint; NULL until it has been planned.
    plan: Mapped[Plan | None] = mapped_column(_enum(Plan, "checkpoint_plan"))
    plan_reason: Mapped[str | None] = mapped_column(Text)
    planned_at: Mapped[datetime | None]

    run: Mapped[Run] = relationship(back_populates="checkpoints")
    jobs: Mapped[list[EvalJob]] = relationship(back_populates="checkpoint")


class CheckpointAlternate(Base):
    """Another shape of a checkpoint's step in the same run (OpenRLHF's ``_actor/global_step2`` beside
    ``global_step2_hf``): recorded against the checkpoint that is evaluated, never evaluated itself."""

    __tablename__ = "checkpoint_alternates"
    __table_args__ = (UniqueConstraint("run_id", "path", name="uq_checkpoint_alternates_run_path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(String(500))
    layout: Mapped[str] = mapped_column(String(32))
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)


class IgnoredFolder(Base):
    """A folder under a run root that could be a checkpoint and is not taken, with why (``evald status``
    shows them: discovery skips nothing silently). Deleted when the folder goes or is taken after all."""

    __tablename__ = "ignored_folders"
    __table_args__ = (UniqueConstraint("run_id", "path", name="uq_ignored_folders_run_path"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(String(500))
    reason: Mapped[str] = mapped_column(Text)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class EvalJob(Base):
    __tablename__ = "eval_jobs"
    __table_args__ = (
        UniqueConstraint("checkpoint_id", "task", "stage", name="uq_eval_jobs_checkpoint_task_stage"),
        Index("ix_eval_jobs_state_priority", "state", "priority"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    checkpoint_id: Mapped[int] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(String(200))
    stage: Mapped[str] = mapped_column(String(16), default="full")
    state: Mapped[JobState] = mapped_column(_enum(JobState, "job_state"), default=JobState.PENDING)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    #: Step of the checkpoint, copied so the queue orders without a join.
    step: Mapped[int | None] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    duration_s: Mapped[float | None] = mapped_column(Float)
    load_s: Mapped[float | None] = mapped_column(Float)
    error_kind: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    #: Why a deferred or skipped job is not running (the unmet threshold, the newer checkpoint).
    wait_reason: Mapped[str | None] = mapped_column(Text)
    #: When the job was first deferred since it was last started; the stuck limit counts from here.
    deferred_at: Mapped[datetime | None]
    stuck_at: Mapped[datetime | None]
    #: Batches whose tp ranks generated different tokens, in the stored result (None: tp = 1).
    tp_disagreements: Mapped[int | None] = mapped_column(Integer)
    #: Inputs the stored result left out of its metrics (bad dataset rows, failed samples); None for a job
    #: not yet stored, or stored before evald counted them.
    problems: Mapped[int | None] = mapped_column(Integer)
    #: The running claim's submission to an executor other than ``local`` (``Handle.to_json``: a Slurm job
    #: id), recorded as soon as it is queued; None for a local worker or before submission.
    executor_handle: Mapped[str | None] = mapped_column(Text)
    #: Where the scheduler has that submission now (``PENDING (Resources)``, ``RUNNING on node1``).
    executor_state: Mapped[str | None] = mapped_column(Text)

    checkpoint: Mapped[Checkpoint] = relationship(back_populates="jobs")
    results: Mapped[list[Result]] = relationship(back_populates="job")
    history: Mapped[list[JobAttempt]] = relationship(back_populates="job", order_by="JobAttempt.id")


class JobAttempt(Base):
    """One worker run of a job: every try, out-of-memory retries with a smaller batch included."""

    __tablename__ = "job_attempts"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("eval_jobs.id", ondelete="CASCADE"), index=True)
    #: The claim it belongs to (``eval_jobs.attempts`` then).
    attempt: Mapped[int] = mapped_column(Integer)
    engine: Mapped[str] = mapped_column(String(16))
    tp: Mapped[int] = mapped_column(Integer)
    dp: Mapped[int] = mapped_column(Integer)
    batch_size: Mapped[int] = mapped_column(Integer)
    #: succeeded, failed, retried (to be claimed again), out_of_memory (rerun with half the batch),
    #: requeued (daemon shutdown), cancelled (its checkpoint or run went away while it was queued).
    outcome: Mapped[str] = mapped_column(String(16))
    error_kind: Mapped[str | None] = mapped_column(String(64))
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    duration_s: Mapped[float] = mapped_column(Float)
    #: The scheduler's view of a run through Slurm (all None for a local worker): its Slurm job id, the
    #: nodes it ran on, how long it waited in the queue and ran, and the state it ended in (``COMPLETED``,
    #: ``TIMEOUT``, ``CANCELLED``, ...).
    slurm_job_id: Mapped[str | None] = mapped_column(String(32))
    nodes: Mapped[str | None] = mapped_column(Text)
    queue_wait_s: Mapped[float | None] = mapped_column(Float)
    run_s: Mapped[float | None] = mapped_column(Float)
    exit_state: Mapped[str | None] = mapped_column(String(32))

    job: Mapped[EvalJob] = relationship(back_populates="history")


class ResultSeries(Base):
    """A (run, task, stage) with a succeeded job: written in the transaction that stores the job's results
    (``complete_job``), so "the newest results of every run" starts from these few rows instead of finding
    the distinct pairs among every job (a scan of all jobs: 200 ms at 100,000). Never deleted but with
    its run; a key whose jobs were later requeued only finds no step."""

    __tablename__ = "result_series"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    task: Mapped[str] = mapped_column(String(200), primary_key=True)
    stage: Mapped[str] = mapped_column(String(16), primary_key=True)


class Result(Base):
    __tablename__ = "results"
    __table_args__ = (UniqueConstraint("job_id", "metric", name="uq_results_job_metric"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("eval_jobs.id", ondelete="CASCADE"))
    metric: Mapped[str] = mapped_column(String(100))
    #: NULL only for NaN on SQLite (see :class:`MetricFloat`).
    value: Mapped[float] = mapped_column(MetricFloat, nullable=True)
    n: Mapped[int | None] = mapped_column(Integer)
    stderr: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[EvalJob] = relationship(back_populates="results")


class Sample(Base):
    __tablename__ = "samples"
    __table_args__ = (UniqueConstraint("job_id", "index", name="uq_samples_job_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("eval_jobs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    prompt_id: Mapped[str] = mapped_column(String(200))
    prompt: Mapped[str] = mapped_column(Text)
    response: Mapped[str] = mapped_column(Text)
    extracted: Mapped[str | None] = mapped_column(Text)
    reference: Mapped[str] = mapped_column(Text)
    #: NULL for a sample with no right answer (an lm-eval perplexity sample): not graded.
    correct: Mapped[bool | None] = mapped_column(Boolean)
    tokens: Mapped[int] = mapped_column(Integer)
    truncated: Mapped[bool] = mapped_column(Boolean)
    reward: Mapped[float | None] = mapped_column(Float)
    #: Mean token entropy over the response, in nats.
    entropy: Mapped[float | None] = mapped_column(Float)
    #: Why the sample is left out of every metric; NULL for a sample that counts.
    error: Mapped[str | None] = mapped_column(Text)
    #: A code task's sample: ``passed`` or the first failing test's verdict; tests passed of the total;
    #: tests by verdict; the first failing test and what the program wrote. NULL for other kinds.
    verdict: Mapped[str | None] = mapped_column(String(32))
    tests_passed: Mapped[int | None] = mapped_column(Integer)
    tests_total: Mapped[int | None] = mapped_column(Integer)
    verdicts: Mapped[dict[str, int] | None] = mapped_column(JSON)
    failed_test: Mapped[str | None] = mapped_column(Text)
    failed_output: Mapped[str | None] = mapped_column(Text)


class SampleProblem(Base):
    """An input a job's metrics left out: a bad dataset row or a sample whose reward failed. Every one is
    kept, whatever ``max_samples`` cut from the samples."""

    __tablename__ = "sample_problems"

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("eval_jobs.id", ondelete="CASCADE"), index=True)
    #: ``FILE:LINE`` for a dataset row, ``sample INDEX`` for a sample.
    where: Mapped[str] = mapped_column(Text)
    message: Mapped[str] = mapped_column(Text)
    prompt_id: Mapped[str | None] = mapped_column(String(200))
    #: The sample's index; NULL for a dataset row.
    index: Mapped[int | None] = mapped_column(Integer)


class AlertState(enum.StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Alert(Base):
    """One anomaly or operational problem of a run, by its fingerprint (run, rule, metric, task): a repeat
    of a firing alert updates this row; after it resolves, the same fingerprint fires this row again."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str | None] = mapped_column(String(200))
    metric: Mapped[str | None] = mapped_column(String(100))
    rule: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    state: Mapped[AlertState] = mapped_column(_enum(AlertState, "alert_state"))
    #: The onset: the earliest checkpoint step it fired at since it last started firing (None for a
    #: run-level event). Where a person rolls back from; what is shown by default.
    first_step: Mapped[int | None] = mapped_column(Integer)
    #: The latest checkpoint step it fired at since it last started firing.
    last_step: Mapped[int | None] = mapped_column(Integer)
    #: The step whose result resolved it (None while firing).
    resolved_step: Mapped[int | None] = mapped_column(Integer)
    checkpoint: Mapped[str | None] = mapped_column(String(500))
    #: None for an alert with no value (a failed evaluation); a NaN value is NULL on SQLite too.
    value: Mapped[float | None] = mapped_column(Float)
    baseline: Mapped[float | None] = mapped_column(Float)
    best_step: Mapped[int | None] = mapped_column(Integer)
    rollback_step: Mapped[int | None] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text)
    #: When it last started firing.
    fired_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    resolved_at: Mapped[datetime | None]
    #: When it was last sent: a repeat within the cooldown updates the row without sending again.
    notified_at: Mapped[datetime | None]
    #: Findings since it last started firing.
    repeats: Mapped[int] = mapped_column(Integer, default=1)


class OutboxState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    #: Its endpoint answered 410 Gone: nothing more is sent there.
    DISABLED = "disabled"
    #: Refused for good (a 4xx other than 408/429, ``PERMANENT_AFTER`` times) or not renderable.
    FAILED = "failed"


class OutboxMessage(Base):
    """One alert event for one endpoint, written in the transaction that stored the alert; the relay sends
    it until the endpoint takes it. ``event_id`` is its ``webhook-id``, the same on every retry."""

    __tablename__ = "alert_outbox"
    __table_args__ = (
        Index("ix_alert_outbox_state_next", "state", "next_attempt_at"),
        Index("ix_alert_outbox_endpoint_target", "endpoint", "target"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    #: None: a tracker's message (endpoint ``tracker:<name>``), which belongs to no alert.
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    endpoint: Mapped[str] = mapped_column(String(200))
    #: A tracker's message: the key of where it goes (``TrackerConfig.target``: the server and experiment,
    #: the W&B project, the TensorBoard folder); only the rows of the tracker's current target are sent.
    #: None: a webhook's, or a tracker's queued before targets were kept (taken by its tracker's target).
    target: Mapped[str | None] = mapped_column(String(64))
    event_id: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[OutboxState] = mapped_column(
        _enum(OutboxState, "outbox_state"), default=OutboxState.PENDING
    )
    #: The event as JSON (the alert's facts when it happened), rendered per endpoint format when sent.
    body: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)


class Delivery(Base):
    """One attempt to send an outbox message: every try is kept."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(primary_key=True)
    outbox_id: Mapped[int] = mapped_column(ForeignKey("alert_outbox.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime]
    duration_s: Mapped[float] = mapped_column(Float)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    retry_after_s: Mapped[float | None] = mapped_column(Float)


class WebhookEndpoint(Base):
    """An endpoint's standing: one that answered 410 Gone is disabled until ``evald webhook test`` gets a
    2xx from it."""

    __tablename__ = "webhook_endpoints"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    disabled_at: Mapped[datetime | None]
    disabled_reason: Mapped[str | None] = mapped_column(Text)
