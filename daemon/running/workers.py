"""A job's worker process (or worker group) seen from the daemon: started, watched, killed, read.

The daemon learns what happened only from files: rank 0's result, a result file of any rank that
reported an error (a rejected input, out of memory), and for a crash the launcher's summary of which
rank died first and that rank's own log. Killing takes the whole tree: torchrun starts each rank in a
session of its own, out of reach of a signal to torchrun's process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import structlog

from inference.spec import EXIT_DISK_FULL, JobResult, JobSpec

log = structlog.get_logger("evald.workers")

#: How much of a crashed worker's stderr is kept on the job.
STDERR_TAIL_CHARS = 4000
#: How long a worker group's launcher has, after SIGTERM, to stop its ranks before all are SIGKILLed.
STOP_GRACE_SECS = 5.0

# torchrun's failure summary names the first rank that failed and how it exited.
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL
)
#: Each failed rank of torchrun's summary (its "Failures" and "Root Cause" entries).
_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)


#: How much of a worker's log is searched for the cause of its crash.
CAUSE_SEARCH_CHARS = 64000
#: The longest cause kept on the first line of a crash's error.
CAUSE_CHARS = 500

_TRACEBACK = "Traceback (most recent call last):"
#: Lines a process that died in C or C++ leaves: faulthandler's, libstdc++'s, glibc's.
_FATAL = re.compile(
    r"^(Fatal Python error: .*|terminate called .*|\s*what\(\): .*|.*(?:Segmentation fault|Aborted)"
    r"(?: \(core dumped\))?$)"
)

_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)(?::.*)?$")


def crash_cause(log_text: str) -> str | None:
    """The line of a dead worker's log that says why it died (pure): the exception line of the last
    Python traceback, else the last structlog event at level error or critical, else the last line a
    native crash leaves (faulthandler's "Fatal Python error", C++'s "terminate called"); ``None`` when
    the log says nothing (a SIGKILL from outside: the exit status is all there is)."""
    lines = log_text.splitlines()
    start = max((i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)), default=None)
    if start is not None:
        # The frames are indented; the first line at the margin after them is "Type: message".
        for line in lines[start + 1 :]:
            if line.strip() and not line[0].isspace():
                return _short(line)
    for line in reversed(lines):
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("level") in ("error", "critical"):
            detail = event.get("error") or event.get("message") or event.get("exception") or ""
            return _short(f"{event.get('event')}: {detail}" if detail else str(event.get("event")))
    fatal = [line.strip() for line in lines if _FATAL.match(line)]
    if fatal:
        return _short(" ".join(fatal[-2:]))
    # A tail cut after its traceback's start (a scheduler's last lines) may still end in the exception.
    raised = [line for line in lines if _EXCEPTION.match(line)]
    return _short(raised[-1]) if raised else None


def _short(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= CAUSE_CHARS else flat[: CAUSE_CHARS - 1] + "…"


def crash_error(what: str, log_path: Path) -> str:
    """A crash's error: ``what`` died, why (:func:`crash_cause`) on the same first line, which is all
    ``evald status`` shows, then the tail of its log on the lines below it, for ``evald history``."""
    cause = crash_cause(stderr_tail(log_path, limit=CAUSE_SEARCH_CHARS))
    tail = stderr_tail(log_path)
    first = f"{what}: {cause}" if cause is not None else f"{what}, with no error in its log"
    return f"{first}\nits log ends:\n{tail}" if tail else first


def stderr_tail(path: Path, limit: int = STDERR_TAIL_CHARS) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", errors="replace").strip()
    except FileNotFoundError:
        return ""


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, command: Sequence[str], log_path: Path, env: Mapping[str, str]) -> WorkerProcess:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env=dict(env),
            )
        return cls(process, log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self) -> int:
        return self.process.wait()

    def kill(self, grace_secs: float = STOP_GRACE_SECS) -> None:
        """Stop the worker and every process under it, and reap them.

        SIGTERM first, so that a launcher can pass it on to ranks on other nodes, then SIGKILL for every
        process still here after ``grace_secs``.
        """
        try:
            descendants = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            descendants = []
        if self.process.poll() is None and descendants:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_secs)
        # A launcher's ranks (torchrun's) run in sessions of their own, out of killpg's reach, and may
        # have started after the list above (a job killed while its group starts): stop the whole tree,
        # so that nothing in it starts another, then kill all it holds.
        root = None
        if self.process.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                root = psutil.Process(self.process.pid)
        stopped = stop_tree(root, descendants)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for child in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        self.process.wait()
        psutil.wait_procs(stopped, timeout=10)


def stop_tree(root: psutil.Process | None, known: Sequence[psutil.Process]) -> list[psutil.Process]:
    """Suspend ``root`` (None: already reaped) and every process under it or under ``known``, walking the
    tree again after each round until a walk finds no process it had not stopped; returns all of them
    but ``root``."""
    roots = [root] if root is not None else []
    for process in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.suspend()
    found: set[psutil.Process] = set()
    tops = [*roots, *known]
    while True:
        tree: set[psutil.Process] = set(known)
        for top in tops:
            with contextlib.suppress(psutil.NoSuchProcess):
                tree.update(top.children(recursive=True))
        new = tree - found
        if not new:
            return list(found)
        for process in new:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.suspend()
        found |= new
        tops = [*roots, *found]


@dataclass(frozen=True)
class Outcome:
    #: The result of a worker that evaluated the checkpoint.
    result: JobResult | None = None
    #: Why it did not: a worker error kind (``checkpoint_invalid``, ``out_of_memory``, …) or ``crash``.
    error_kind: str | None = None
    error: str = ""


def _read(path: Path) -> JobResult | None:
    try:
        return JobResult.read(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("job.result_unreadable", path=str(path), error=str(exc))
        return None


def rank_results(spec: JobSpec) -> list[JobResult]:
    """The error reports of ranks other than 0, by rank."""
    folder = spec.result_path.parent
    paths = sorted(
        folder.glob("result.rank*.json"), key=lambda p: int(p.stem.removeprefix("result.rank") or 0)
    )
    return [result for result in map(_read, paths) if result is not None]


def failed_rank(launcher_log: str) -> tuple[int, int] | None:
    """``(rank, exit code)`` of the rank whose failure brought the group down, from torchrun's summary;
    None if absent.

    torchrun names the first failure it observed, but ranks that fail together share a timestamp (to
    the second), and a rank killed by a signal takes its peers down at once (gloo: "Connection closed by
    peer", exit status 1): then it named rank 0. A rank killed by a signal is a cause, never a
    consequence, so it is named before a rank that exited with an error."""
    match = _ROOT_CAUSE.search(launcher_log)
    if match is None:
        return None
    root = (int(match.group(1)), int(match.group(2)))
    if root[1] < 0:
        return root
    failures = [(int(rank), int(code)) for rank, code in _FAILURE.findall(launcher_log)]
    return next((failure for failure in failures if failure[1] < 0), root)


def describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


def read_outcome(spec: JobSpec, code: int, log_path: Path) -> Outcome:
    """What the worker (group) that exited with ``code`` did, from its files."""
    result = _read(spec.result_path)
    if code == 0 and result is not None and result.error is None:
        return Outcome(result=result)
    reports = [r for r in (result, *rank_results(spec)) if r is not None and r.error is not None]
    # One rank out of memory may bring down its peers with other errors: memory decides the retry.
    reports.sort(key=lambda r: r.error is None or r.error.kind != "out_of_memory")
    if reports and reports[0].error is not None:
        return Outcome(error_kind=reports[0].error.kind, error=reports[0].error.message)
    if code == 0:
        return Outcome(error_kind="crash", error="worker exited without writing a result")
    root = failed_rank(stderr_tail(log_path, limit=20000))
    if root is None:
        if code == EXIT_DISK_FULL:
            return disk_full(spec, log_path, None)
        return Outcome(error_kind="crash", error=crash_error(f"worker {describe_exit(code)}", log_path))
    rank, rank_code = root
    rank_log = log_path.with_name(f"rank-{rank}.log")
    if rank_code == EXIT_DISK_FULL:
        return disk_full(spec, rank_log, rank)
    return Outcome(
        error_kind="crash", error=crash_error(f"rank {rank} failed ({describe_exit(rank_code)})", rank_log)
    )


def disk_full(spec: JobSpec, log_path: Path, rank: int | None) -> Outcome:
    """A worker (or rank) that could not write its result for want of space: the host's fault, not the
    checkpoint's (kind ``disk_full``, which spends no attempt)."""
    path = spec.result_path if not rank else spec.result_path.with_name(f"result.rank{rank}.json")
    who = "worker" if rank is None else f"rank {rank}"
    error = f"disk full writing result at {path} ({who} exit status {EXIT_DISK_FULL})"
    tail = stderr_tail(log_path)
    return Outcome(error_kind="disk_full", error=f"{error}\nits log ends:\n{tail}" if tail else error)


def _attempt_folders(state_dir: Path, job_id: int, attempts: int) -> list[Path]:
    """Job ``job_id``'s worker folders of claim ``attempts``, newest first: ``jobs/ID-ATTEMPTS``, and
    ``jobs/ID-ATTEMPTS-batchN`` for its reruns at a halved batch size."""
    name = f"{job_id}-{attempts}"
    folders = [
        p for p in (state_dir / "jobs").glob(f"{name}*") if p.name == name or p.name.startswith(f"{name}-")
    ]
    return sorted(folders, key=lambda p: p.stat().st_mtime, reverse=True)


def _spec(folder: Path) -> JobSpec | None:
    try:
        return JobSpec.model_validate_json((folder / "spec.json").read_bytes())
    except (OSError, ValueError):
        return None


def attempt_spec(state_dir: Path, job_id: int, attempts: int) -> JobSpec | None:
    """The spec the newest worker of claim ``attempts`` ran under, if its folder is readable here."""
    try:
        folders = _attempt_folders(state_dir, job_id, attempts)
    except OSError:
        return None
    for folder in folders:
        spec = _spec(folder)
        if spec is not None:
            return spec
    return None


def finished_result(state_dir: Path, job_id: int, attempts: int) -> tuple[JobSpec, Outcome] | None:
    """The spec and successful outcome of job ``job_id``'s worker run number ``attempts``, if that worker
    wrote its result before its daemon died; None otherwise (the newest folder counts)."""
    for folder in _attempt_folders(state_dir, job_id, attempts):
        if not (folder / "result.json").is_file():
            continue
        spec = _spec(folder)
        if spec is None:
            continue
        outcome = read_outcome(spec, 0, folder / "worker.log")
        if outcome.result is not None and spec.result_path.parent == folder:
            return spec, outcome
    return None
