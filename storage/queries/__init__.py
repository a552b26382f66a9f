"""Every statement evald runs: small functions over a session, returning plain data.

Callers open the transaction (``Database.session()``); each function here is one step inside it, so a
caller can make several steps atomic (a job's results, samples and ``succeeded`` commit together).

Split by what it answers: :mod:`.jobs` (the queue: runs, checkpoints, jobs and their attempts),
:mod:`.status` (where checkpoints and jobs stand), :mod:`.results` (metric values), :mod:`.samples` (one
job's samples and problems). Alerts and the outbox are :mod:`storage.alerting`. Every name is re-exported
here, so callers keep writing ``queries.job_rows``.
"""

from storage.queries.jobs import (
    CLAIMABLE,
    AttemptRow,
    ClaimedJob,
    NewCheckpoint,
    checkpoint_states,
    claim_next_job,
    complete_job,
    enqueue_jobs,
    ensure_run,
    fail_job,
    heartbeat,
    job_history,
    job_state,
    mark_checkpoint,
    record_attempt,
    record_checkpoint,
    recover_orphans,
    register_discovered,
    requeue_job,
)
from storage.queries.results import MetricRow, ResultRow, latest_results, result_rows
from storage.queries.samples import (
    ERROR_CHARS,
    LISTED,
    NEAREST_STEPS,
    STAGE_PREFERENCE,
    JobSamples,
    ProblemRow,
    SampleRow,
    SamplesUnavailable,
    job_samples,
)
from storage.queries.status import (
    CheckpointRow,
    DurationBuckets,
    JobRow,
    RunRow,
    change_marks,
    checkpoint_rows,
    job_durations,
    job_rows,
    job_state_counts,
    run_rows,
)

__all__ = [
    "CLAIMABLE",
    "ERROR_CHARS",
    "LISTED",
    "NEAREST_STEPS",
    "STAGE_PREFERENCE",
    "AttemptRow",
    "CheckpointRow",
    "ClaimedJob",
    "DurationBuckets",
    "JobRow",
    "JobSamples",
    "MetricRow",
    "NewCheckpoint",
    "ProblemRow",
    "ResultRow",
    "RunRow",
    "SampleRow",
    "SamplesUnavailable",
    "change_marks",
    "checkpoint_rows",
    "checkpoint_states",
    "claim_next_job",
    "complete_job",
    "enqueue_jobs",
    "ensure_run",
    "fail_job",
    "heartbeat",
    "job_durations",
    "job_history",
    "job_rows",
    "job_samples",
    "job_state",
    "job_state_counts",
    "latest_results",
    "mark_checkpoint",
    "record_attempt",
    "record_checkpoint",
    "recover_orphans",
    "register_discovered",
    "requeue_job",
    "result_rows",
    "run_rows",
]
