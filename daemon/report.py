"""Turning rows into what a person or a program reads: aligned tables, JSON, CSV."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any, Literal

from daemon.curves import Comparison, Difference
from daemon.scheduling.resources import Check
from storage import alerting
from storage.queries import (
    AlternateRow,
    AttemptRow,
    CheckpointRow,
    IgnoredRow,
    JobRow,
    JobSamples,
    ProblemRow,
    ResultRow,
    SampleRow,
)
from storage.scheduling import PlanRow

Format = Literal["table", "json", "csv"]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) >= 1e6:
            # Six significant digits: a perplexity of 1.8e29 has no meaningful 30th digit to print.
            return f"{value:.6g}"
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
    return "\n".join(lines)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def result_dicts(rows: Iterable[ResultRow]) -> list[dict[str, Any]]:
    # Field by field rather than asdict(), which deep-copies every value: 10x slower on the API's pages.
    out = []
    for row in rows:
        shown = {k: _jsonable(getattr(row, k)) for k in RESULT_FIELDS}
        if row.no_samples:
            shown["value"] = None  # not the NaN stored for it: a mean over nothing has no value
        out.append(shown)
    return out


RESULT_FIELDS = (
    "run",
    "checkpoint",
    "step",
    "epoch",
    "task",
    "stage",
    "metric",
    "value",
    "n",
    "stderr",
    "evaluated_at",
    "no_samples",
)
#: The value cell of a metric over no samples (``n = 0``), in tables and status.
NO_SAMPLES = "no samples"


def results(rows: Sequence[ResultRow], fmt: Format) -> str:
    dicts = result_dicts(rows)
    if fmt == "json":
        return json.dumps(dicts, indent=1)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=RESULT_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(dicts)
        return buffer.getvalue().rstrip("\n")
    headers = RESULT_FIELDS[:-1]  # the value cell says it
    return table(
        headers,
        ([NO_SAMPLES if f == "value" and r.no_samples else getattr(r, f) for f in headers] for r in rows),
    )


CheckpointKey = tuple[str, int | None, str, str]


def metrics_by_checkpoint(rows: Iterable[ResultRow]) -> dict[CheckpointKey, dict[str, float | None]]:
    """(run, step, checkpoint, task) → {metric: value}: one table row per evaluated checkpoint and task;
    ``None`` for a metric over no samples."""
    grouped: dict[CheckpointKey, dict[str, float | None]] = {}
    for row in rows:
        value = None if row.no_samples else row.value
        grouped.setdefault((row.run, row.step, row.checkpoint, row.task), {})[row.metric] = value
    return grouped


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
        run_plans = [p for p in plans if p.run == run]
        out[run] = {
            "checkpoints": _count(c.state for c in run_checkpoints),
            "jobs": _count(j.state for j in run_jobs),
            "last_evaluated_step": max(
                (j.step for j in run_jobs if j.state == "succeeded" and j.step is not None), default=None
            ),
            "schedule": {k: _jsonable_deep(v) for k, v in (schedules or {}).get(run, {}).items()},
            "queue": _queue(run_jobs),
            "running": [
                {
                    "job": j.id,
                    "step": j.step,
                    "task": j.task,
                    "stage": j.stage,
                    "attempt": j.attempts,
                    "max_attempts": max_attempts,
                    "held_by": j.claimed_by,
                    "started_at": _jsonable(j.started_at),
                    "heartbeat_at": _jsonable(j.heartbeat_at),
                }
                for j in run_jobs
                if j.state == "running"
            ],
            "deferred": [
                {"job": j.id, "step": j.step, "task": j.task, "stage": j.stage, "reason": j.wait_reason}
                for j in run_jobs
                if j.state == "deferred"
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
                for j in run_jobs
                if j.state in RETRYING_STATES and j.attempts > 0 and j.error is not None
            ],
            # Still being written, or incomplete until invalid_after_secs: newer ones are not held back.
            "not_ready": [
                {"checkpoint": c.name, "step": c.step, "reason": c.reason}
                for c in run_checkpoints
                if c.state == "discovered"
            ],
            "waiting": [_plan(p) for p in run_plans if p.plan == "waiting"],
            "skipped": [_plan(p) for p in run_plans if p.plan == "skipped"],
            "problems": [
                {"checkpoint": c.name, "step": c.step, "state": c.state, "reason": c.reason}
                for c in run_checkpoints
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
                for j in run_jobs
                if j.state == "failed"
            ],
            "tp_disagreements": [
                {"job": j.id, "step": j.step, "task": j.task, "batches": j.tp_disagreements}
                for j in run_jobs
                if j.tp_disagreements
            ],
            "left_out": [
                {"job": j.id, "step": j.step, "task": j.task, "stage": j.stage, "inputs": j.problems}
                for j in run_jobs
                if j.problems
            ],
            "no_samples": [
                {
                    "step": r.step,
                    "checkpoint": r.checkpoint,
                    "task": r.task,
                    "stage": r.stage,
                    "metric": r.metric,
                }
                for r in latest
                if r.run == run and r.no_samples
            ],
            "ignored": [{"folder": i.name, "reason": i.reason} for i in ignored if i.run == run],
            "alternates": [
                {"folder": a.name, "layout": a.layout, "of": a.of} for a in alternates if a.run == run
            ],
        }
    return out


#: States of a job that runs again after a failed attempt (its error stays until it succeeds).
RETRYING_STATES = ("pending", "deferred", "running")


def _attempts(done: int, most: int | None) -> str:
    return f"{done} of {most} attempt(s)" if most is not None else f"{done} attempt(s)"


def _jsonable_deep(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _jsonable_deep(v) for k, v in value.items()}
    return _jsonable(value)


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


def resources_text(check: Check | None) -> str:
    if check is None:
        return "resources: no thresholds set"
    lines = [f"resources: {'met' if check.met else 'NOT met: ' + check.reason}"]
    lines.extend(f"  {note}" for note in check.not_applicable)
    return "\n".join(lines)


#: How many skipped checkpoints the text status lists (the JSON lists all).
SKIPPED_SHOWN = 10
#: How much of a retrying job's last error the text status shows.
RETRY_ERROR_CHARS = 200


def status_text(summary: Mapping[str, Any]) -> str:
    lines = []
    for run, info in summary.items():
        checkpoints = ", ".join(f"{k} {v}" for k, v in info["checkpoints"].items()) or "none"
        jobs = ", ".join(f"{k} {v}" for k, v in info["jobs"].items()) or "none"
        lines.append(f"run {run}: last evaluated step {_cell(info['last_evaluated_step'])}")
        schedule = info.get("schedule") or {}
        if schedule:
            lines.append(f"  frequency:   {schedule['frequency']} (backlog {schedule['backlog']})")
            lines.append(f"  next due:    {schedule['next_due']}")
            if "adaptive" in schedule:
                adaptive = schedule["adaptive"]
                lines.append(f"  adaptive:    every {adaptive['every_steps']} steps: {adaptive['reason']}")
        lines.append(f"  checkpoints: {checkpoints}")
        lines.append(f"  jobs:        {jobs}")
        for group in info.get("queue", []):
            steps = ", ".join(str(s) for s in group["steps"][:8]) + (
                " ..." if len(group["steps"]) > 8 else ""
            )
            where = f"priority {group['priority']} {group['stage']}"
            lines.append(f"  queue:       {where}: {group['jobs']} job(s), steps {steps}")
        for job in info.get("running", []):
            where = f"step {_cell(job['step'])} [{job['task']}/{job['stage']}] (job {job['job']})"
            most = job.get("max_attempts")
            attempt = f"attempt {job['attempt']}" + (f" of {most}" if most is not None else "")
            lines.append(
                f"  running:     {where} on {job['held_by']}, {attempt}, "
                f"last heartbeat {_cell(job['heartbeat_at'])}"
            )
            if job.get("slurm_job_id") is not None:
                lines.append(
                    f"    slurm:     job {job['slurm_job_id']}: {job.get('scheduler_state') or 'submitted'}"
                )
        for job in info.get("deferred", []):
            lines.append(
                f"  deferred:    step {_cell(job['step'])} [{job['task']}/{job['stage']}]: {job['reason']}"
            )
        for job in info.get("retrying", []):
            where = f"step {_cell(job['step'])} [{job['task']}/{job['stage']}] (job {job['job']})"
            error = one_line(job["error"], RETRY_ERROR_CHARS)
            lines.append(
                f"  retrying:    {where}: {job['state']}, {_attempts(job['attempts'], job['max_attempts'])} "
                f"so far; last error {job['kind']}: {error}"
            )
        for folder in info.get("not_ready", []):
            lines.append(f"  not ready:   {folder['checkpoint']}: {folder['reason'] or 'being written'}")
        for plan in info.get("waiting", []):
            lines.append(f"  waiting:     {plan['checkpoint']}: {plan['reason']}")
        skipped = info.get("skipped", [])
        for plan in skipped[-SKIPPED_SHOWN:]:
            lines.append(f"  skipped:     {plan['checkpoint']}: {plan['reason']}")
        if len(skipped) > SKIPPED_SHOWN:
            lines.append(
                f"  skipped:     ... and {len(skipped) - SKIPPED_SHOWN} earlier (--format json lists all)"
            )
        for problem in info["problems"]:
            what = problem["checkpoint"] + (f" [{problem['task']}]" if "task" in problem else "")
            job = (
                f" (job {problem['job']}, {_attempts(problem['attempts'], problem.get('max_attempts'))})"
                if "job" in problem
                else ""
            )
            lines.append(f"  {problem['state']}: {what}{job}: {problem['reason']}")
        for found in info.get("tp_disagreements", []):
            lines.append(
                f"  tp ranks disagreed: step {_cell(found['step'])} [{found['task']}] (job {found['job']}): "
                f"{found['batches']} batch(es), settled by majority"
            )
        for job in info.get("left_out", []):
            where = f"step {_cell(job['step'])} [{job['task']}/{job['stage']}] (job {job['job']})"
            lines.append(
                f"  left out:    {where}: {job['inputs']} input(s) with problems (see `evald samples`)"
            )
        for row in info.get("no_samples", []):
            where = f"{row['metric']} [{row['task']}/{row['stage']}] at step {_cell(row['step'])}"
            lines.append(
                f"  {NO_SAMPLES}:  {where} ({row['checkpoint']}), the newest evaluated: "
                "computed over no samples (n = 0)"
            )
        for folder in info.get("ignored", []):
            lines.append(f"  ignored:     {folder['folder']}: {folder['reason']}")
        for alternate in info.get("alternates", []):
            lines.append(
                f"  alternate:   {alternate['folder']} ({alternate['layout']}): the same step as "
                f"{alternate['of']}, which is evaluated instead"
            )
    return "\n".join(lines)


def history(attempts: Sequence[AttemptRow], output: str) -> str:
    """Every worker run of one job, oldest first."""
    rows: list[dict[str, Any]] = [
        {
            "attempt": a.attempt,
            "outcome": a.outcome,
            "engine": a.engine,
            "tp": a.tp,
            "dp": a.dp,
            "batch_size": a.batch_size,
            "started_at": a.started_at.isoformat(),
            "duration_s": round(a.duration_s, 3),
            "error_kind": a.error_kind,
            "error": a.error,
            # The scheduler's view of a run through Slurm (None for a local worker).
            "slurm_job_id": a.slurm_job_id,
            "nodes": a.nodes,
            "queue_wait_s": None if a.queue_wait_s is None else round(a.queue_wait_s, 1),
            "run_s": None if a.run_s is None else round(a.run_s, 1),
            "exit_state": a.exit_state,
        }
        for a in attempts
    ]
    if output == "json":
        return json.dumps(rows, indent=1)
    columns: tuple[str, ...] = (
        "attempt",
        "outcome",
        "engine",
        "tp",
        "dp",
        "batch_size",
        "duration_s",
        "error_kind",
        "error",
    )
    if any(a.slurm_job_id is not None for a in attempts):
        columns = (*columns[:7], *SLURM_HISTORY_COLUMNS, *columns[7:])
    cut = [
        {**r, "error": None if r["error"] is None else one_line(r["error"], HISTORY_ERROR_CHARS)}
        for r in rows
    ]
    return table(columns, [tuple(r[c] for c in columns) for r in cut])


#: The columns a job's history table gains when one of its attempts ran through Slurm.
SLURM_HISTORY_COLUMNS = ("slurm_job_id", "nodes", "queue_wait_s", "run_s", "exit_state")

#: How much of an attempt's error the table shows (``--format json`` shows all of it).
HISTORY_ERROR_CHARS = 100


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` with its whitespace runs made single spaces, cut to ``limit`` characters if given."""
    flat = " ".join(text.split())
    return flat if limit is None or len(flat) <= limit else flat[: limit - 1] + "…"


#: How much of a prompt id, extracted answer or reference the samples table shows; the response gets the
#: rest of the terminal, but never less than RESPONSE_MIN_CHARS (``--format json`` shows everything).
FIELD_CHARS = 24
RESPONSE_MIN_CHARS = 20
SAMPLE_COLUMNS = (
    "index",
    "prompt_id",
    "correct",
    "reward",
    "tokens",
    "truncated",
    "extracted",
    "reference",
    "response",
)


def _verdict(sample: SampleRow) -> str:
    # A sample with an error was never graded: neither right nor wrong, and out of every metric.
    if sample.error is not None:
        return "error"
    if sample.correct is None:
        return "-"  # not graded: a perplexity sample has a score, no right answer
    return "yes" if sample.correct else "no"


def _short(text: str | None) -> str | None:
    return None if text is None else one_line(text, FIELD_CHARS)


def _problem_line(problem: ProblemRow) -> str:
    prompt = f" (prompt {problem.prompt_id})" if problem.prompt_id is not None else ""
    return f"problem: {problem.where}{prompt}: {problem.message}"


def samples_text(found: JobSamples, *, width: int, wrong_only: bool = False) -> str:
    """A heading, one table row per sample (the response flattened and cut to fit ``width``), then one
    line per problem."""
    shown = f"{len(found.samples)} wrong of {found.stored}" if wrong_only else str(found.stored)
    heading = (
        f"run {found.run}, step {found.step} ({found.checkpoint}), task {found.task}, stage {found.stage}, "
        f"job {found.job_id}: {shown} sample(s), {len(found.problems)} problem(s)"
    )
    rows = [
        [
            s.index,
            _short(s.prompt_id),
            _verdict(s),
            s.reward,
            s.tokens,
            "yes" if s.truncated else "no",
            _short(s.extracted),
            _short(s.reference),
        ]
        for s in found.samples
    ]
    fixed = [max([len(h)] + [len(_cell(r[i])) for r in rows]) for i, h in enumerate(SAMPLE_COLUMNS[:-1])]
    room = max(RESPONSE_MIN_CHARS, width - sum(fixed) - 2 * len(fixed))
    for row, sample in zip(rows, found.samples, strict=True):
        row.append(one_line(sample.response, room))
    lines = [heading, table(SAMPLE_COLUMNS, rows)]
    lines.extend(one_line(_problem_line(p), max(width, RESPONSE_MIN_CHARS)) for p in found.problems)
    return "\n".join(lines)


def samples_json(found: JobSamples, *, wrong_only: bool = False) -> str:
    return json.dumps(
        {
            "run": found.run,
            "step": found.step,
            "task": found.task,
            "stage": found.stage,
            "job_id": found.job_id,
            "checkpoint": found.checkpoint,
            "stored_samples": found.stored,
            "wrong_only": wrong_only,
            "samples": [asdict(s) for s in found.samples],
            "problems": [asdict(p) for p in found.problems],
        },
        indent=1,
    )


def alert_json(row: alerting.AlertRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "run": row.run,
        "task": row.task,
        "metric": row.metric,
        "rule": row.rule,
        "severity": row.severity,
        "state": row.state,
        # ``step`` is the onset (kept for readers written before ``first_step``).
        "step": row.first_step,
        "first_step": row.first_step,
        "last_step": row.last_step,
        "resolved_step": row.resolved_step,
        "value": row.value,
        "baseline": row.baseline,
        "best_step": row.best_step,
        "rollback_step": row.rollback_step,
        "repeats": row.repeats,
        "message": row.message,
        "fired_at": row.fired_at.isoformat(),
        "resolved_at": None if row.resolved_at is None else row.resolved_at.isoformat(),
        "delivered": row.delivered,
        "queued": row.queued,
    }


def alert_steps(row: alerting.AlertRow) -> str:
    """``840`` (fired once), ``840..960`` (onset to the latest step it fired at), ``840..960 ok@1080``
    (resolved by step 1080's result)."""
    if row.first_step is None:
        steps = "-" if row.last_step is None else f"?..{row.last_step}"
    elif row.last_step is None or row.last_step == row.first_step:
        steps = str(row.first_step)
    else:
        steps = f"{row.first_step}..{row.last_step}"
    if row.resolved_step is not None:
        steps += f" ok@{row.resolved_step}"
    return steps


def alerts_text(rows: Sequence[alerting.AlertRow]) -> str:
    if not rows:
        return "no alerts"
    header = (
        "id",
        "run",
        "task",
        "rule",
        "metric",
        "sev",
        "state",
        "steps",
        "value",
        "baseline",
        "best",
        "rollback",
        "sent",
        "message",
    )
    body = [
        (
            row.id,
            row.run,
            row.task or "-",
            row.rule,
            row.metric or "-",
            row.severity,
            row.state,
            alert_steps(row),
            "-" if row.value is None else f"{row.value:.4g}",
            "-" if row.baseline is None else f"{row.baseline:.4g}",
            "-" if row.best_step is None else row.best_step,
            "-" if row.rollback_step is None else row.rollback_step,
            f"{row.delivered}/{row.queued}",
            one_line(row.message, 80),
        )
        for row in rows
    ]
    return table(header, body)


COMPARISON_FIELDS = (
    "task",
    "stage",
    "metric",
    "step",
    "value_a",
    "value_b",
    "stderr_a",
    "stderr_b",
    "diff",
    "combined_stderr",
    "test",
    "pairs",
    "test_stderr",
    "z",
    "p",
    "p_adjusted",
    "differs",
    "why_not_paired",
    "smoothed_a",
    "smoothed_b",
)


def comparison_rule(found: Comparison) -> str:
    """The test every row was put to, in words (every rendering says it)."""
    smoothing = (
        "no smoothing"
        if not found.smoothing.enabled
        else f"smoothing {found.smoothing.spec} shown for display only, never tested"
    )
    return (
        f"diff = {found.run_b} - {found.run_a} on raw values; paired z-test over shared prompts where both "
        "runs stored every graded sample of the same prompts, else independent z-test with "
        f"sqrt(stderr_a^2 + stderr_b^2); differs when the Benjamini-Hochberg adjusted p <= {found.fdr:g} "
        f"(false discovery rate over the {found.tested} point(s) tested); {smoothing}"
    )


def _difference(row: Difference, fdr: float) -> dict[str, Any]:
    test = row.test
    return {
        "task": row.task,
        "stage": row.stage,
        "metric": row.metric,
        "step": row.step,
        "value_a": row.a,
        "value_b": row.b,
        "stderr_a": row.stderr_a,
        "stderr_b": row.stderr_b,
        "diff": row.diff,
        "combined_stderr": row.combined_stderr,
        "test": None if test is None else test.kind,
        "pairs": None if test is None else test.pairs,
        "test_stderr": None if test is None else test.stderr,
        "z": None if test is None or not math.isfinite(test.z) else test.z,
        "p": None if test is None else test.p,
        "p_adjusted": row.p_adjusted,
        "differs": row.differs(fdr),
        "why_not_paired": row.why,
        "smoothed_a": row.smoothed_a,
        "smoothed_b": row.smoothed_b,
    }


def comparison(found: Comparison, fmt: Format) -> str:
    rows = [_difference(d, found.fdr) for d in found.differences]
    if fmt == "json":
        return json.dumps(
            {
                "run_a": found.run_a,
                "run_b": found.run_b,
                "smoothing": found.smoothing.spec,
                "fdr": found.fdr,
                "tested": found.tested,
                "paired": found.paired,
                "differ": found.different,
                "rule": comparison_rule(found),
                "rows": rows,
                "unmatched": list(found.unmatched),
            },
            indent=1,
        )
    if fmt == "csv":
        buffer = io.StringIO()
        fields = ("run_a", "run_b", *COMPARISON_FIELDS, "fdr", "smoothing")
        writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        extra = {
            "run_a": found.run_a,
            "run_b": found.run_b,
            "fdr": found.fdr,
            "smoothing": found.smoothing.spec,
        }
        writer.writerows({**row, **extra} for row in rows)
        return buffer.getvalue().rstrip("\n")
    verdict = {True: "yes", False: "no", None: "-"}
    smoothed = found.smoothing.enabled
    headers = (
        "task",
        "stage",
        "metric",
        "step",
        found.run_a,
        found.run_b,
        *((f"{found.run_a}~", f"{found.run_b}~") if smoothed else ()),
        "diff",
        "stderr",
        "test",
        "p",
        "p_adj",
        "differs",
    )
    body = [
        (
            r["task"],
            r["stage"],
            r["metric"],
            r["step"],
            _sig(r["value_a"]),
            _sig(r["value_b"]),
            *((_sig(r["smoothed_a"]), _sig(r["smoothed_b"])) if smoothed else ()),
            f"{r['diff']:+.4g}",
            "-" if r["test_stderr"] is None else f"{r['test_stderr']:.3g}",
            "-" if r["test"] is None else r["test"] + ("" if r["pairs"] is None else f"({r['pairs']})"),
            "-" if r["p"] is None else f"{r['p']:.3g}",
            "-" if r["p_adjusted"] is None else f"{r['p_adjusted']:.3g}",
            verdict[r["differs"]],
        )
        for r in rows
    ]
    lines = [
        f"{found.run_a} vs {found.run_b}: {len(rows)} matched point(s), {found.tested} tested "
        f"({found.paired} paired), {found.different} differ at false discovery rate {found.fdr:g}",
        f"({comparison_rule(found)})",
        table(headers, body),
    ]
    if smoothed:
        lines.append(f"{found.run_a}~, {found.run_b}~: smoothed ({found.smoothing.spec}), for display only")
    reasons = sorted(
        {r["why_not_paired"] for r in rows if r["test"] == "independent" and r["why_not_paired"]}
    )
    if reasons:
        lines.append("not paired: " + "; ".join(reasons))
    untested = sorted({r["why_not_paired"] for r in rows if r["test"] is None and r["why_not_paired"]})
    if untested:
        lines.append("no verdict: " + "; ".join(untested))
    lines.extend(f"not compared: {what}" for what in found.unmatched)
    return "\n".join(lines)


def _sig(number: float | None) -> str:
    """A value with 6 significant digits (``%.6g``): no float noise, no meaningless trailing digits."""
    return "-" if number is None else f"{number:.6g}"


def with_scheduler(
    runs: Mapping[str, Any], states: Mapping[int, tuple[str | None, str | None]]
) -> dict[str, Any]:
    """``status``'s summary with each running job's Slurm job id and scheduler state (``PENDING
    (Resources)``) where it was handed to Slurm; ``states``: job id → (stored handle, state)."""
    out: dict[str, Any] = {}
    for run, info in runs.items():
        running = []
        for job in info.get("running", []):
            handle, state = states.get(job["job"], (None, None))
            slurm_id = None
            if handle is not None:
                try:
                    slurm_id = json.loads(handle).get("external_id")
                except (ValueError, AttributeError):
                    slurm_id = None
            running.append({**job, "slurm_job_id": slurm_id, "scheduler_state": state})
        out[run] = {**info, "running": running}
    return out


def cluster_text(cluster: Mapping[str, Any] | None) -> str:
    """``evald status``'s lines on the Slurm queue: evald's jobs the controller holds now."""
    if cluster is None:
        return ""
    head = f"slurm queue (partition {cluster['partition']}, prefix {cluster['prefix']}): "
    if cluster.get("error"):
        return head + f"not read: {cluster['error']}"
    jobs = cluster["jobs"]
    lines = [head + (f"{len(jobs)} job(s) queued or running" if jobs else "no job queued or running")]
    if cluster.get("problem"):
        lines.append(f"  not submitting: {cluster['problem']}")
    for job in jobs:
        where = f" on {job['nodes']}" if job.get("nodes") else ""
        why = f" ({job['reason']})" if job.get("reason") and job["state"] != "RUNNING" else ""
        lines.append(
            f"  slurm {job['slurm_job_id']}: evald job {job['job']} attempt {job['attempt']} "
            f"[{job['run']}] {job['state']}{why}{where}"
        )
    return "\n".join(lines)
