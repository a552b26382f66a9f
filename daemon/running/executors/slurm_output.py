"""What Slurm's tools print, read: :class:`SlurmJob` rows, and the errors a command's output reports.

Each parser takes the text a real Slurm printed (tests/slurm/outputs holds some) and returns
:class:`SlurmJob` rows; :mod:`.slurm_cli` runs the tools and hands their output here.

A controller that does not answer is :class:`SlurmUnreachable`, apart from every other failure
(:class:`SlurmError`): the caller waits and asks again; nothing it knew about its jobs is wrong.

Versions: 22.05's ``squeue --json`` ignores the filters (``-j``, ``--name``) and lists every job the
controller still holds, finished ones included, and reports a controller it cannot reach as an entry of
``errors`` with exit status 0; its ``exit_code`` is the raw wait status and ``job_state`` a string.
23.02 and later give ``exit_code`` and ``time_limit`` as objects and ``job_state`` as a list: both read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from daemon.errors import EvaldError

#: What the tools print when the controller is away (restart, outage, a network cut).
_UNREACHABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "zero bytes were transmitted or received",
    "connection refused",
    "slurmctld is not responding",
    "communication connection failure",
)

#: Scheduler states whose job is gone for good (the rest wait or run).
FINISHED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)

#: States in which a job has not started (a start time shown is the scheduler's forecast).
_NOT_STARTED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})

#: ``squeue -o`` fields for the version without ``--json``; the comment goes last so that a ``|`` in
#: someone's comment cannot shift the other fields.
SQUEUE_FORMAT = "%i|%T|%r|%j|%N|%V|%S|%e|%l|%P|%B|%k"
_SQUEUE_FIELDS = SQUEUE_FORMAT.count("|") + 1

#: ``sacct -P`` fields, in order.
SACCT_FIELDS = ("JobID", "JobName", "State", "ExitCode", "NodeList", "Submit", "Start", "End", "Partition")


class SlurmError(EvaldError, RuntimeError):
    """A Slurm command failed (the message quotes what it printed)."""

    def __init__(self, command: Sequence[str], message: str, returncode: int | None = None) -> None:
        self.command = tuple(command)
        self.returncode = returncode
        self.message = message
        super().__init__(f"{' '.join(self.command[:2])}: {message}")


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer: wait and ask again (the jobs go on under slurmd meanwhile)."""


class SlurmMissing(SlurmError):
    """A Slurm command is not installed here (or not on PATH)."""


class SubmitRejected(SlurmError):
    """``sbatch`` refused the job (a bad partition, account, QoS or time limit): resubmitting as it is
    would fail again."""


@dataclass(frozen=True)
class Refusal:
    """What an ``sbatch`` refusal is about: the ``[executor]`` setting to look at and what to check."""

    #: The config field path (``executor.qos``).
    field: str
    hint: str


#: sbatch's refusals, by the words Slurm (22.05, slurm_errno.c and sbatch's option parser) prints, and
#: the setting each points at; the first that matches wins. Every option of evald's batch script comes
#: from the config, so each is a config's refusal: no other job would be accepted either.
REFUSALS: tuple[tuple[str, Refusal], ...] = (
    ("invalid partition", Refusal("executor.partition", "Slurm has no such partition")),
    (
        "invalid feature specification",
        Refusal("executor.extra_sbatch", "a --constraint names a feature no node of the partition has"),
    ),
    (
        "generic resource",
        Refusal(
            "executor.gpu_request",
            'the job asks for GPUs ([inference] device = "cuda", --gpus-per-node or --gres) or a --gres '
            "in executor.extra_sbatch that the partition's nodes do not have",
        ),
    ),
    (
        "invalid account",
        Refusal("executor.account", "Slurm knows no such account, or it may not use the partition"),
    ),
    ("invalid qos", Refusal("executor.qos", "Slurm knows no such QoS, or the account may not use it")),
    (
        "accounting/qos policy",
        Refusal("executor.qos", "a limit of the account or QoS (jobs, size or time) refuses the job"),
    ),
    ("time limit", Refusal("executor.time_limit", "more than the partition or QoS allows")),
    ("memory specification", Refusal("executor.mem", "more memory than a node of the partition has")),
    ("reservation", Refusal("executor.extra_sbatch", "a --reservation Slurm does not have (or not for you)")),
    ("license", Refusal("executor.extra_sbatch", "a --licenses Slurm does not have")),
    ("invalid node name", Refusal("executor.exclude", "a node name Slurm does not know")),
    (
        "node configuration is not available",
        Refusal(
            "executor.extra_sbatch",
            "no node of the partition can hold the job as asked (executor.nodes, cpus_per_task, mem, "
            "exclude, [inference] tp × dp, or an option in extra_sbatch)",
        ),
    ),
    (
        "not permitted to use this partition",
        Refusal("executor.partition", "your group may not use the partition"),
    ),
    ("access/permission denied", Refusal("executor.account", "Slurm denies it to this user or account")),
    ("unrecognized option", Refusal("executor.extra_sbatch", "sbatch has no such option")),
    ("is ambiguous", Refusal("executor.extra_sbatch", "an abbreviated option sbatch cannot place")),
    ("invalid --", Refusal("executor.extra_sbatch", "an option's value sbatch cannot read")),
)

#: Any other refusal: the section as a whole.
OTHER_REFUSAL = Refusal("executor", "evald's jobs differ only in their names and folders")


def refusal(said: str) -> Refusal:
    """What sbatch's refusal ``said`` is about (see :data:`REFUSALS`)."""
    lowered = said.lower()
    for words, found in REFUSALS:
        if words in lowered:
            return found
    return OTHER_REFUSAL


@dataclass(frozen=True)
class SlurmJob:
    """One job as the scheduler reports it. Times are seconds since the epoch; None where not yet set."""

    job_id: str
    name: str
    #: The base state in capitals (``PENDING``, ``RUNNING``, ``TIMEOUT``, ...), without flags.
    state: str
    #: Why it waits or ended (``Resources``, ``JobHeldUser``, ``TimeLimit``); None when Slurm says None.
    reason: str | None = None
    comment: str = ""
    #: Slurm's node list expression (``node[01-04]``); empty while pending.
    nodes: str = ""
    partition: str = ""
    #: The batch script's exit status, and the signal that ended it (None where not known).
    exit_code: int | None = None
    exit_signal: int | None = None
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    #: None for no limit.
    time_limit_s: int | None = None
    restarts: int = 0
    batch_host: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def queue_wait_s(self) -> float | None:
        if self.submit_time is None or self.start_time is None:
            return None
        return max(0.0, self.start_time - self.submit_time)

    @property
    def run_s(self) -> float | None:
        if self.start_time is None or self.end_time is None:
            return None
        return max(0.0, self.end_time - self.start_time)


def parse_sbatch(stdout: str) -> str:
    """The job id from ``sbatch --parsable``: ``ID`` or ``ID;CLUSTER``."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = line.split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise ValueError(f"sbatch --parsable printed no job id: {stdout.strip()!r}")
    return job_id


def _state(value: object) -> str:
    # 22.05: "RUNNING"; 23.02+: ["RUNNING"] or ["PENDING", "REQUEUED"]; scontrol: "CANCELLED" or
    # "CANCELLED+" (the flag of "by someone"), "RUNNING+COMPLETING".
    if isinstance(value, list):
        value = value[0] if value else ""
    text = str(value).strip().upper()
    return re.split(r"[+ ]", text, maxsplit=1)[0] if text else "UNKNOWN"


def _number(value: object) -> int | None:
    """An integer field: plain, or 23.02's ``{"set": true, "infinite": false, "number": N}``."""
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return int(value)
    return None


def _epoch(value: object) -> float | None:
    number = _number(value)
    return float(number) if number else None


def _exit(value: object) -> tuple[int | None, int | None]:
    """(exit status, signal) from squeue --json's ``exit_code``."""
    if isinstance(value, dict):
        # 23.02+: {"status": [...], "return_code": {...} | int, "signal": {"id": {...} | int, ...}}
        code = _number(value.get("return_code"))
        signal = value.get("signal")
        sig = _number(signal.get("id")) if isinstance(signal, dict) else _number(signal)
        return code, sig or None
    raw = _number(value)
    if raw is None:
        return None, None
    # 22.05: the raw wait status of the batch script (768 = exit 3, 15 = SIGTERM).
    return (raw >> 8) & 0xFF, (raw & 0x7F) or None


def _reason(value: object) -> str | None:
    text = str(value or "").strip()
    return None if text in {"", "None", "(null)"} else text


def _text(value: object) -> str:
    text = str(value or "").strip()
    return "" if text.lower() in {"(null)", "none", "n/a"} else text


def _json_job(raw: Mapping[str, Any]) -> SlurmJob:
    code, signal = _exit(raw.get("exit_code"))
    limit = _number(raw.get("time_limit"))
    state = _state(raw.get("job_state"))
    return SlurmJob(
        job_id=str(raw["job_id"]),
        name=_text(raw.get("name")),
        state=state,
        reason=_reason(raw.get("state_reason")),
        comment=_text(raw.get("comment")),
        nodes=_text(raw.get("nodes")),
        partition=_text(raw.get("partition")),
        exit_code=code,
        exit_signal=signal,
        submit_time=_epoch(raw.get("submit_time")),
        # A pending job's start and a running one's end are the scheduler's forecasts, not times.
        start_time=None if state in _NOT_STARTED else _epoch(raw.get("start_time")),
        end_time=_epoch(raw.get("end_time")) if state in FINISHED_STATES else None,
        time_limit_s=None if limit is None else limit * 60,
        restarts=_number(raw.get("restart_cnt")) or 0,
        batch_host=_text(raw.get("batch_host")),
    )


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """Every job in ``squeue --json``'s output; an unreachable controller raises :class:`SlurmUnreachable`."""
    command = ("squeue", "--json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(command, f"output is not JSON ({exc}): {text[:200]!r}") from exc
    if not isinstance(data, dict):
        raise SlurmError(command, f"output is not a JSON object: {text[:200]!r}")
    errors = data.get("errors") or []
    if errors:
        said = "; ".join(
            f"{e.get('source', '?')}: {e.get('description') or e.get('error') or e}"
            if isinstance(e, dict)
            else str(e)
            for e in errors
        )
        # 22.05 reports a controller it could not reach only as "slurm_load_jobs: Failed while looking
        # for jobs" (error -1), and lists no job: never read that as "the queue is empty".
        loading = any(isinstance(e, dict) and e.get("source") == "slurm_load_jobs" for e in errors)
        if loading or is_unreachable(said):
            raise SlurmUnreachable(command, said)
        raise SlurmError(command, said)
    return [_json_job(job) for job in data.get("jobs") or []]


def _time(value: str) -> float | None:
    """scontrol's and squeue's local time stamps (``2026-12-01T21:09:20``); None for Unknown/N/A/NONE."""
    text = value.strip()
    if not text or text[0] not in "0123456789":
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_duration(text: str) -> int | None:
    """Slurm's ``[days-]hours:minutes:seconds`` (or ``minutes:seconds``) in seconds; None for UNLIMITED."""
    value = text.strip()
    if not value or value.upper() in {"UNLIMITED", "INFINITE", "NONE", "N/A", "PARTITION_LIMIT"}:
        return None
    if not re.fullmatch(r"(\d+-)?\d+(:\d+){0,2}", value):
        # INVALID, NOT_SET and whatever a later Slurm prints: no limit to read, not a failed queue read.
        return None
    days = 0
    if "-" in value:
        head, value = value.split("-", 1)
        days = int(head)
    parts = [int(p) for p in value.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


# scontrol -o prints KEY=VALUE pairs separated by spaces, and a value may hold spaces (a comment, a
# command line): a pair starts only where a known-shaped key follows a space.
_PAIR = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol_fields(line: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    matches = list(_PAIR.finditer(line))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


def parse_scontrol_job(line: str) -> SlurmJob:
    """One line of ``scontrol show job -o``."""
    fields = parse_scontrol_fields(line)
    if "JobId" not in fields:
        raise ValueError(f"not a line of scontrol show job -o: {line[:200]!r}")
    code_text, _, signal_text = fields.get("ExitCode", "").partition(":")
    state = _state(fields.get("JobState", ""))
    return SlurmJob(
        job_id=fields["JobId"],
        name=_text(fields.get("JobName")),
        state=state,
        reason=_reason(fields.get("Reason")),
        comment=_text(fields.get("Comment")),
        nodes=_text(fields.get("NodeList")),
        partition=_text(fields.get("Partition")),
        exit_code=int(code_text) if code_text.isdigit() else None,
        exit_signal=int(signal_text) if signal_text.isdigit() and int(signal_text) else None,
        submit_time=_time(fields.get("SubmitTime", "")),
        start_time=_time(fields.get("StartTime", ""))
        if _state(fields.get("JobState", "")) != "PENDING"
        else None,
        end_time=_time(fields.get("EndTime", ""))
        if _state(fields.get("JobState", "")) in FINISHED_STATES
        else None,
        time_limit_s=parse_duration(fields.get("TimeLimit", "")),
        restarts=int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0,
        batch_host=_text(fields.get("BatchHost")),
    )


def parse_squeue_format(text: str) -> list[SlurmJob]:
    """``squeue -h -t all -o SQUEUE_FORMAT`` (no exit codes: ``scontrol show job`` has them)."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", _SQUEUE_FIELDS - 1)
        if len(parts) != _SQUEUE_FIELDS:
            raise ValueError(f"squeue line has {len(parts)} fields, not {_SQUEUE_FIELDS}: {line[:200]!r}")
        job_id, state, reason, name, nodes, submit, start, end, limit, partition, host, comment = parts
        jobs.append(
            SlurmJob(
                job_id=job_id.strip(),
                name=_text(name),
                state=_state(state),
                reason=_reason(reason),
                comment=_text(comment),
                nodes=_text(nodes),
                partition=_text(partition),
                submit_time=_time(submit),
                start_time=None if _state(state) in _NOT_STARTED else _time(start),
                end_time=_time(end) if _state(state) in FINISHED_STATES else None,
                time_limit_s=parse_duration(limit),
                batch_host=_text(host),
            )
        )
    return jobs


def parse_sacct(text: str) -> list[SlurmJob]:
    """``sacct -X -n -P -o SACCT_FIELDS`` (one line per job allocation)."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < len(SACCT_FIELDS):
            raise ValueError(f"sacct line has {len(parts)} fields, not {len(SACCT_FIELDS)}: {line[:200]!r}")
        row = dict(zip(SACCT_FIELDS, parts, strict=False))
        code_text, _, signal_text = row["ExitCode"].partition(":")
        state = _state(row["State"])
        jobs.append(
            SlurmJob(
                job_id=row["JobID"],
                name=_text(row["JobName"]),
                state=state,
                nodes=_text(row["NodeList"]) if row["NodeList"] != "None assigned" else "",
                partition=_text(row["Partition"]),
                exit_code=int(code_text) if code_text.isdigit() else None,
                exit_signal=int(signal_text) if signal_text.isdigit() and int(signal_text) else None,
                submit_time=_time(row["Submit"]),
                start_time=_time(row["Start"]),
                end_time=_time(row["End"]),
            )
        )
    return jobs


def parse_sinfo_limits(text: str) -> dict[str, int | None]:
    """``sinfo -h -o %R|%l``: each partition's MaxTime in seconds (None: no limit)."""
    limits: dict[str, int | None] = {}
    for line in text.splitlines():
        name, _, limit = line.strip().partition("|")
        if not name or name in limits:
            continue
        try:
            limits[name] = parse_duration(limit)
        except ValueError:
            limits[name] = None
    return limits


def is_unreachable(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in _UNREACHABLE)
