"""Every statement evald runs: small functions over a session, returning plain data.

Callers open the transaction (``Database.session()``); each function here is one step inside it, so a
caller can make several steps atomic (a job's results, samples and ``succeeded`` commit together).

Split by what it answers: :mod:`.queue_entries` (runs, checkpoints and the jobs enqueued for them),
:mod:`.claims` (claiming a job, its lease and fencing token, its submission), :mod:`.recovery` (claims of
daemons taken for dead), :mod:`.outcomes` (results stored, failures, attempts' history), :mod:`.status`
(where checkpoints and jobs stand), :mod:`.results` (metric values), :mod:`.samples` (one job's samples
and problems). Alerts are :mod:`storage.alerting`, the outbox :mod:`storage.outbox`. Every name is re-exported
here, so callers keep writing ``queries.job_rows``; each module is imported when one of its names is
first asked for, so a command that reads results never imports the claims' or the recovery's statements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evald.lazy import export

if TYPE_CHECKING:
    from storage.queries.checkpoints import (
        AlternateRow,
        IgnoredRow,
        SameStep,
        alternate_paths,
        alternate_rows,
        forget_ignored,
        ignored_paths,
        ignored_rows,
        record_alternate,
        record_ignored,
        same_step,
    )
    from storage.queries.claims import (
        CLAIMABLE,
        ClaimedJob,
        checkpoints_in_use,
        claim_job,
        claim_next_job,
        executor_states,
        heartbeat,
        job_handle,
        record_handle,
        requeue_job,
        running_claims,
        set_executor_state,
        submitted_per_run,
    )
    from storage.queries.latest import latest_results
    from storage.queries.outcomes import (
        AttemptRow,
        attempt_recorded,
        complete_job,
        fail_job,
        job_history,
        record_attempt,
    )
    from storage.queries.queue_entries import (
        NewCheckpoint,
        checkpoint_states,
        enqueue_jobs,
        ensure_run,
        job_at,
        job_state,
        mark_checkpoint,
        record_checkpoint,
        register_discovered,
    )
    from storage.queries.recovery import (
        Orphan,
        fail_orphan,
        orphans,
        recover_orphans,
        requeue_orphans,
        take_over,
    )
    from storage.queries.results import (
        MetricRow,
        ResultRow,
        result_rows,
        run_exists,
        run_has_results,
        run_names,
    )
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

#: Each name's module, in this package.
_HOMES = {
    "AlternateRow": "checkpoints",
    "IgnoredRow": "checkpoints",
    "SameStep": "checkpoints",
    "alternate_paths": "checkpoints",
    "alternate_rows": "checkpoints",
    "forget_ignored": "checkpoints",
    "ignored_paths": "checkpoints",
    "ignored_rows": "checkpoints",
    "record_alternate": "checkpoints",
    "record_ignored": "checkpoints",
    "same_step": "checkpoints",
    "CLAIMABLE": "claims",
    "ClaimedJob": "claims",
    "checkpoints_in_use": "claims",
    "claim_job": "claims",
    "claim_next_job": "claims",
    "executor_states": "claims",
    "heartbeat": "claims",
    "job_handle": "claims",
    "record_handle": "claims",
    "requeue_job": "claims",
    "running_claims": "claims",
    "set_executor_state": "claims",
    "submitted_per_run": "claims",
    "AttemptRow": "outcomes",
    "attempt_recorded": "outcomes",
    "complete_job": "outcomes",
    "fail_job": "outcomes",
    "job_history": "outcomes",
    "record_attempt": "outcomes",
    "NewCheckpoint": "queue_entries",
    "checkpoint_states": "queue_entries",
    "enqueue_jobs": "queue_entries",
    "ensure_run": "queue_entries",
    "job_at": "queue_entries",
    "job_state": "queue_entries",
    "mark_checkpoint": "queue_entries",
    "record_checkpoint": "queue_entries",
    "register_discovered": "queue_entries",
    "Orphan": "recovery",
    "fail_orphan": "recovery",
    "orphans": "recovery",
    "recover_orphans": "recovery",
    "requeue_orphans": "recovery",
    "take_over": "recovery",
    "MetricRow": "results",
    "ResultRow": "results",
    "latest_results": "latest",
    "result_rows": "results",
    "run_exists": "results",
    "run_has_results": "results",
    "run_names": "results",
    "ERROR_CHARS": "samples",
    "LISTED": "samples",
    "NEAREST_STEPS": "samples",
    "STAGE_PREFERENCE": "samples",
    "JobSamples": "samples",
    "ProblemRow": "samples",
    "SampleRow": "samples",
    "SamplesUnavailable": "samples",
    "job_samples": "samples",
    "CheckpointRow": "status",
    "DurationBuckets": "status",
    "JobRow": "status",
    "RunRow": "status",
    "change_marks": "status",
    "checkpoint_rows": "status",
    "job_durations": "status",
    "job_rows": "status",
    "job_state_counts": "status",
    "run_rows": "status",
}


def __getattr__(name: str) -> Any:
    """``queries.X``: its module imported on first use (:func:`evald.lazy.export`)."""
    return export(__name__, _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "CLAIMABLE",
    "ERROR_CHARS",
    "LISTED",
    "NEAREST_STEPS",
    "STAGE_PREFERENCE",
    "AlternateRow",
    "AttemptRow",
    "CheckpointRow",
    "ClaimedJob",
    "DurationBuckets",
    "IgnoredRow",
    "JobRow",
    "JobSamples",
    "MetricRow",
    "NewCheckpoint",
    "Orphan",
    "ProblemRow",
    "ResultRow",
    "RunRow",
    "SameStep",
    "SampleRow",
    "SamplesUnavailable",
    "alternate_paths",
    "alternate_rows",
    "attempt_recorded",
    "change_marks",
    "checkpoint_rows",
    "checkpoint_states",
    "checkpoints_in_use",
    "claim_job",
    "claim_next_job",
    "complete_job",
    "enqueue_jobs",
    "ensure_run",
    "executor_states",
    "fail_job",
    "fail_orphan",
    "forget_ignored",
    "heartbeat",
    "ignored_paths",
    "ignored_rows",
    "job_at",
    "job_durations",
    "job_handle",
    "job_history",
    "job_rows",
    "job_samples",
    "job_state",
    "job_state_counts",
    "latest_results",
    "mark_checkpoint",
    "orphans",
    "record_alternate",
    "record_attempt",
    "record_checkpoint",
    "record_handle",
    "record_ignored",
    "recover_orphans",
    "register_discovered",
    "requeue_job",
    "requeue_orphans",
    "result_rows",
    "run_exists",
    "run_has_results",
    "run_names",
    "run_rows",
    "running_claims",
    "same_step",
    "set_executor_state",
    "submitted_per_run",
    "take_over",
]
