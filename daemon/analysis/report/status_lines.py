"""``evald status`` as text: each run's summary, the resource thresholds and the Slurm queue, line by line."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from daemon.analysis.report.cells import NO_SAMPLES, cell, duration, first_line
from storage.scheduling import HELD_PREFIX

if TYPE_CHECKING:
    from daemon.scheduling.resources import Check


def _attempts(done: int, most: int | None) -> str:
    return f"{done} of {most} attempt(s)" if most is not None else f"{done} attempt(s)"


def resources_text(check: Check | None) -> str:
    if check is None:
        return "resources: no thresholds set"
    lines = [f"resources: {'met' if check.met else 'NOT met: ' + check.reason}"]
    lines.extend(f"  {note}" for note in check.not_applicable)
    return "\n".join(lines)


#: How many skipped checkpoints the text status lists (the JSON lists all).
SKIPPED_SHOWN = 10
#: How much of an error's first line the text status shows where no terminal width is known.
ERROR_CHARS = 200
#: The least of it shown however narrow the terminal.
MIN_ERROR_CHARS = 40
#: Where a continuation line's text starts (under the values of the labelled lines above it).
INDENT = " " * 15


def _error(prefix: str, error: str | None, width: int | None, job: int | None = None) -> list[str]:
    """``prefix`` and the first line of ``error``, cut to fit ``width`` (or ``ERROR_CHARS`` of it); a
    line below says how many lines were left out and where they are (the job's history)."""
    room = ERROR_CHARS if width is None else max(MIN_ERROR_CHARS, width - len(prefix))
    head, more = first_line(error or "", room)
    lines = [prefix + head]
    if more:
        where = f": evald history {job}" if job is not None else ""
        lines.append(f"{INDENT}({more} more line{'s' if more > 1 else ''}{where})")
    return lines


def scheduler_name(executor: str | None) -> str:
    """How status names an executor's queue: ``Slurm``, ``Ray``."""
    return {"slurm": "Slurm", "ray": "Ray"}.get(executor or "slurm", str(executor))


def _jobs_line(info: Mapping[str, Any]) -> str:
    """Jobs by state, a running count split into those waiting in the scheduler's queue, those whose
    state nobody knows (its controller does not answer) and those running."""
    slurm = info.get("slurm")
    parts = []
    for state, count in info["jobs"].items():
        if state == "running" and slurm and (slurm["pending"] or slurm.get("unknown")):
            name = scheduler_name(slurm.get("executor"))
            if slurm["pending"]:
                reasons = slurm["reasons"]
                why = ", ".join(r if len(reasons) == 1 else f"{r} {n}" for r, n in reasons.items())
                parts.append(f"pending in {name} {slurm['pending']} ({why})")
            if slurm.get("unknown"):
                parts.append(f"state unknown {slurm['unknown']} ({name} does not answer)")
            parts.append(f"running {count - slurm['pending'] - slurm.get('unknown', 0)}")
        else:
            parts.append(f"{state} {count}")
    return ", ".join(parts) or "none"


def _held(jobs: list[Mapping[str, Any]]) -> list[str]:
    """Queued jobs held back, one line per reason: a run's held jobs share it (its per-run limit)."""
    by_reason: dict[str, list[Mapping[str, Any]]] = {}
    for job in jobs:
        by_reason.setdefault(str(job["reason"]), []).append(job)
    lines = []
    for reason, group in by_reason.items():
        steps = [cell(j["step"]) for j in group]
        shown = ", ".join(steps[:8]) + (" ..." if len(steps) > 8 else "")
        said = reason.removeprefix(HELD_PREFIX)
        lines.append(f"  held:        {len(group)} job(s), step(s) {shown}: {said}")
    return lines


def status_text(summary: Mapping[str, Any], width: int | None = None) -> str:
    """Each run's status; errors are shown by their first line, cut to ``width`` columns (a terminal's)."""
    lines = []
    for run, info in summary.items():
        lines.extend(_progress_lines(run, info))
        for job in info.get("running", []):
            lines.extend(_running_lines(job))
        lines.extend(_waiting_lines(info, width))
        lines.extend(_problem_lines(info["problems"], width))
        lines.extend(_finding_lines(info))
    return "\n".join(lines)


def _progress_lines(run: str, info: Mapping[str, Any]) -> list[str]:
    """A run's head: its newest evaluated step, schedule, counts by state, queue and held jobs."""
    checkpoints = ", ".join(f"{k} {v}" for k, v in info["checkpoints"].items()) or "none"
    lines = [f"run {run}: last evaluated step {cell(info['last_evaluated_step'])}"]
    schedule = info.get("schedule") or {}
    if schedule:
        lines.append(f"  frequency:   {schedule['frequency']} (backlog {schedule['backlog']})")
        lines.append(f"  next due:    {schedule['next_due']}")
        if "adaptive" in schedule:
            adaptive = schedule["adaptive"]
            lines.append(f"  adaptive:    every {adaptive['every_steps']} steps: {adaptive['reason']}")
    lines.append(f"  checkpoints: {checkpoints}")
    lines.append(f"  jobs:        {_jobs_line(info)}")
    for group in info.get("queue", []):
        steps = ", ".join(str(s) for s in group["steps"][:8]) + (" ..." if len(group["steps"]) > 8 else "")
        where = f"priority {group['priority']} {group['stage']}"
        lines.append(f"  queue:       {where}: {group['jobs']} job(s), steps {steps}")
    lines.extend(_held(info.get("held", [])))
    return lines


def _running_lines(job: Mapping[str, Any]) -> list[str]:
    """A running job: waiting in a scheduler's queue, or running (with its scheduler's job, if any)."""
    where = f"step {cell(job['step'])} [{job['task']}/{job['stage']}] (job {job['job']})"
    most = job.get("max_attempts")
    attempt = f"attempt {job['attempt']}" + (f" of {most}" if most is not None else "")
    if job.get("in_slurm") == "unknown":
        name = scheduler_name(job.get("executor"))
        since = _moment(job.get("unknown_since"))
        held = "" if job.get("unknown_for_s") is None else f" ({duration(job['unknown_for_s'])})"
        return [
            f"  unknown:     {where}: {name} job {cell(job.get('slurm_job_id'))} state unknown since "
            f"{since}{held}: {job.get('reason')}; {attempt}, submitted by {job['held_by']}"
        ]
    if job.get("in_slurm") == "pending":
        name = scheduler_name(job.get("executor"))
        said = job.get("scheduler_state") or "submitted"
        waited = "" if job.get("queue_wait_s") is None else f", waiting {duration(job['queue_wait_s'])}"
        return [
            f"  in {name}:{' ' * max(1, 9 - len(name))}{where}: {name} job "
            f"{cell(job.get('slurm_job_id'))} {said}{waited}; "
            f"{attempt}, submitted by {job['held_by']}"
        ]
    lines = [
        f"  running:     {where} on {job['held_by']}, {attempt}, last heartbeat {cell(job['heartbeat_at'])}"
    ]
    if job.get("slurm_job_id") is not None:
        label = f"{job.get('executor') or 'slurm'}:"
        lines.append(f"    {label:<11}job {job['slurm_job_id']}: {job.get('scheduler_state') or 'submitted'}")
    return lines


def _waiting_lines(info: Mapping[str, Any], width: int | None) -> list[str]:
    """Jobs deferred or being retried, and checkpoints not ready, waiting their turn or skipped."""
    lines = [
        f"  deferred:    step {cell(job['step'])} [{job['task']}/{job['stage']}]: {job['reason']}"
        for job in info.get("deferred", [])
    ]
    for job in info.get("retrying", []):
        where = f"step {cell(job['step'])} [{job['task']}/{job['stage']}] (job {job['job']})"
        prefix = (
            f"  retrying:    {where}: {job['state']}, {_attempts(job['attempts'], job['max_attempts'])} "
            f"so far; last error {job['kind']}: "
        )
        lines.extend(_error(prefix, job["error"], width, job["job"]))
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
    return lines


def _problem_lines(problems: list[Mapping[str, Any]], width: int | None) -> list[str]:
    """Checkpoints invalid or gone and jobs failed for good, each with its error's first line."""
    lines = []
    for problem in problems:
        what = problem["checkpoint"] + (f" [{problem['task']}]" if "task" in problem else "")
        job = (
            f" (job {problem['job']}, {_attempts(problem['attempts'], problem.get('max_attempts'))})"
            if "job" in problem
            else ""
        )
        lines.extend(
            _error(f"  {problem['state']}: {what}{job}: ", problem["reason"], width, problem.get("job"))
        )
    return lines


def _finding_lines(info: Mapping[str, Any]) -> list[str]:
    """What evaluations and discovery noticed: ranks that disagreed, inputs left out, metrics over no
    samples, folders ignored, alternate shapes of a step."""
    lines = [
        f"  tp ranks disagreed: step {cell(found['step'])} [{found['task']}] (job {found['job']}): "
        f"{found['batches']} batch(es), settled by majority"
        for found in info.get("tp_disagreements", [])
    ]
    for job in info.get("left_out", []):
        where = f"step {cell(job['step'])} [{job['task']}/{job['stage']}] (job {job['job']})"
        lines.append(f"  left out:    {where}: {job['inputs']} input(s) with problems (see `evald samples`)")
    for row in info.get("no_samples", []):
        where = f"{row['metric']} [{row['task']}/{row['stage']}] at step {cell(row['step'])}"
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
    return lines


def executor_text(executor: Mapping[str, Any] | None) -> str:
    """``evald status``'s line on the executor's controller while a daemon says it does not answer (what,
    since when, the daemon that saw it, and what that means: no claim, no job's state known); else
    nothing."""
    if not executor or executor.get("reachable") is not False:
        return ""
    since = _moment(executor.get("since"))
    held = "" if executor.get("away_s") is None else f" ({duration(executor['away_s'])})"
    head, _ = first_line(str(executor.get("error") or ""), ERROR_CHARS)
    return (
        f"executor: unreachable since {since}{held}: {executor.get('what')} does not answer (as daemon "
        f"{executor.get('daemon')} saw it); claiming paused; the states of the jobs handed to it are "
        "unknown until it answers" + (f"; it said: {head}" if head else "")
    )


def _moment(iso: str | None) -> str:
    """``2026-05-01T10:00:00Z``: a stored UTC time to the second (as it is where it does not parse)."""
    try:
        return datetime.fromisoformat(str(iso)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return str(iso or "?")


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
