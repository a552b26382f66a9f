"""The evaluation worker process: ``python -m inference.worker SPEC.json``.

Reads a :class:`~inference.spec.JobSpec`, runs its task and writes a :class:`~inference.spec.JobResult`
to ``spec.result_path`` (atomically). Exit status:

- 0: evaluated; the result holds metrics and samples.
- :data:`~inference.spec.EXIT_INPUT_ERROR`: the input was rejected (bad checkpoint, dataset or task);
  the result holds the error, and stderr one line saying what is wrong.
- :data:`~inference.spec.EXIT_OUT_OF_MEMORY`: the batch did not fit; the result holds the error, and the
  daemon retries with half the batch size.
- anything else: a crash; stderr holds the traceback, and there may be no result file.

Started by ``torchrun`` or the ``deepspeed`` launcher, each rank runs this module: rank 0 writes the result,
another rank writes ``result.rank<N>.json`` only to report an error, and each rank logs to
``rank-<N>.log`` beside the result.

Logs are structlog events on stderr, JSON lines unless stderr is a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import structlog

from inference.errors import InferenceError
from inference.group import launched_rank
from inference.lifeline import die_with_parent, watch_daemon
from inference.spec import (
    EXIT_DISK_FULL,
    EXIT_INPUT_ERROR,
    EXIT_OUT_OF_MEMORY,
    JobResult,
    JobSpec,
    WorkerError,
)

log = structlog.get_logger("inference.worker")

#: A full filesystem or quota: the host's fault, never the checkpoint's.
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


class _FullDiskTolerant:
    """A log stream whose writes on a full disk are dropped: the log file shares the disk with the result,
    and a lost log line must not turn a finished evaluation into a crash."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            return 0

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise


def configure_logging(level: int = logging.INFO) -> None:
    """structlog to stderr: JSON lines for the daemon to keep, or readable lines on a terminal."""
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(_FullDiskTolerant(sys.stderr)),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def quiet_libraries() -> None:
    """No network, no progress bars, no library chatter on stderr: the daemon keeps only its tail."""
    # Set before transformers is imported: huggingface_hub reads these once.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # lm_eval tasks: datasets reads its cache and local files only (an operator may set it to 0).
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def skip_mlflow() -> None:
    """Make ``import mlflow`` fail in this process, as if it were not installed.

    DeepSpeed's autotuner imports mlflow at ``import deepspeed`` whenever it is installed (evald's
    ``mlflow`` extra puts it in the same environment), to log tuning runs no worker starts: 4 of the
    8 CPU seconds that importing DeepSpeed took per rank on a 2-core machine. Trackers run in the daemon,
    never in a worker.
    """
    sys.modules.setdefault("mlflow", None)  # type: ignore[arg-type]


def _log_to_file(path: Path) -> None:
    """Send this rank's stdout and stderr to its own file: the daemon keeps the tail of the rank that died."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    return isinstance(exc, MemoryError) or (torch is not None and isinstance(exc, torch.OutOfMemoryError))


def result_path(spec: JobSpec, rank: int) -> Path:
    """Rank 0 writes the job's result; another rank writes a file of its own only to report an error."""
    return spec.result_path if rank == 0 else spec.result_path.with_name(f"result.rank{rank}.json")


def write_result(result: JobResult, path: Path) -> int | None:
    """Write ``result`` to ``path``; on a full disk (ENOSPC, EDQUOT) say so in one line and return
    :data:`EXIT_DISK_FULL`, the exit status that tells the daemon the host is at fault. Other errors raise."""
    try:
        result.write(path)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        log.error("worker.disk_full", error=f"disk full writing result at {path}", strerror=exc.strerror)
        with contextlib.suppress(OSError):
            print(f"evald worker: disk full writing result at {path}", file=sys.stderr, flush=True)
        return EXIT_DISK_FULL
    return None


def run(spec: JobSpec, rank: int) -> tuple[JobResult | None, int]:
    """Evaluate ``spec`` as ``rank``: the result to write (None on ranks with nothing to say) and the exit
    status. A rejected input or an out-of-memory error becomes a result with the error."""
    from inference.faults import Faults
    from inference.group import WorkerGroup
    from inference.task import run_task

    try:
        group = WorkerGroup.start(spec.inference)
        result = run_task(spec, group, Faults.from_environment())
    except InferenceError as exc:
        return JobResult(
            job_id=spec.job_id, error=WorkerError(kind=exc.kind, message=exc.message)
        ), EXIT_INPUT_ERROR
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        message = (
            f"rank {rank}: out of memory at batch size {spec.task.batch_size}: {' '.join(str(exc).split())}"
        )
        return JobResult(
            job_id=spec.job_id, error=WorkerError(kind="out_of_memory", message=message)
        ), EXIT_OUT_OF_MEMORY
    group.close()
    return result, 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.worker", description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="JobSpec JSON file")
    args = parser.parse_args(argv)

    die_with_parent()
    watch_daemon()
    spec = JobSpec.model_validate_json(args.spec.read_text(encoding="utf-8"))
    rank = launched_rank()
    if rank is not None:
        _log_to_file(spec.result_path.parent / f"rank-{rank}.log")
    # A rank that aborts inside a C++ library (gloo, NCCL, a DeepSpeed op) leaves only "terminate called"
    # behind: the Python stack of every thread goes to its log, whose tail the job keeps.
    faulthandler.enable(all_threads=True)
    quiet_libraries()
    skip_mlflow()
    if not spec.inference.device.startswith("cuda"):
        # DeepSpeed picks its accelerator once, at import; a CPU job on a GPU node must not take CUDA.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    configure_logging()
    structlog.contextvars.bind_contextvars(job_id=spec.job_id, rank=rank or 0)
    log.info(
        "worker.started",
        checkpoint=str(spec.checkpoint_path),
        task=spec.task.name,
        engine=spec.inference.engine,
        batching=spec.inference.batching,
        tp=spec.inference.tp,
        dp=spec.inference.dp,
        batch_size=spec.task.batch_size,
    )

    result, code = run(spec, rank or 0)
    if result is not None:
        unwritten = write_result(result, result_path(spec, rank or 0))
        if unwritten is not None:
            if rank is not None:
                os._exit(unwritten)  # as below: peers may wait for this rank
            return unwritten
    if result is not None and result.error is not None:
        log.warning("worker.rejected", kind=result.error.kind, message=result.error.message)
        with contextlib.suppress(OSError):
            print(f"evald worker: {result.error.kind}: {result.error.message}", file=sys.stderr, flush=True)
        if rank is not None:
            # Peers may wait in a collective for this rank: leave now, the launcher stops them.
            os._exit(code)
        return code
    if result is not None:
        log.info(
            "worker.finished",
            result=str(spec.result_path),
            metrics={m.name: None if m.n == 0 else m.value for m in result.metrics},
            total_s=result.timing.total_s if result.timing else None,
        )
    return 0


if __name__ == "__main__":
    code = main()
    # On a full disk the log's last lines may not fit; the exit status still must get out.
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    # The result is written and closed; the interpreter's own teardown (torch's, DeepSpeed's and
    # transformers' exit hooks, freeing the module graph) took over a second of CPU per job for nothing.
    os._exit(code)
