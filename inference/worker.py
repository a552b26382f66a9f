"""The evaluation worker process: ``python -m inference.worker SPEC.json``.

Reads a :class:`~inference.spec.JobSpec`, runs its task and writes a :class:`~inference.spec.JobResult`
to ``spec.result_path`` (atomically). Exit status:

- 0: evaluated; the result holds metrics and samples.
- :data:`~inference.spec.EXIT_INPUT_ERROR`: the input was rejected (bad checkpoint, dataset or task);
  the result holds the error, and stderr one line saying what is wrong.
- anything else: a crash; stderr holds the traceback, and there may be no result file.

Logs are structlog events on stderr, JSON lines unless stderr is a terminal.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import structlog

from inference.errors import InferenceError
from inference.spec import EXIT_INPUT_ERROR, PARENT_PID_ENV, JobResult, JobSpec, WorkerError

log = structlog.get_logger("inference.worker")
_PR_SET_PDEATHSIG = 1


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
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def quiet_libraries() -> None:
    """No network, no progress bars, no library chatter on stderr: the daemon keeps only its tail."""
    # Set before transformers is imported: huggingface_hub reads these once.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def die_with_parent() -> None:
    """Exit when the daemon that started this worker dies, even by SIGKILL.

    A worker nobody will read must not go on holding GPUs; its job is redone when the daemon restarts.
    """
    expected = os.environ.get(PARENT_PID_ENV, "")
    if not expected.isdigit() or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(expected):
        # The daemon died before the signal was armed.
        os._exit(1)


def run(spec: JobSpec) -> JobResult:
    """Evaluate ``spec``; a rejected input becomes a result with an error, anything else propagates."""
    from inference.task import run_task

    try:
        return run_task(spec)
    except InferenceError as exc:
        return JobResult(job_id=spec.job_id, error=WorkerError(kind=exc.kind, message=exc.message))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.worker", description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="JobSpec JSON file")
    args = parser.parse_args(argv)

    die_with_parent()
    quiet_libraries()
    configure_logging()
    spec = JobSpec.model_validate_json(args.spec.read_text(encoding="utf-8"))
    structlog.contextvars.bind_contextvars(job_id=spec.job_id)
    log.info("worker.started", checkpoint=str(spec.checkpoint_path), task=spec.task.name)

    result = run(spec)
    result.write(spec.result_path)
    if result.error is not None:
        log.warning("worker.rejected", kind=result.error.kind, message=result.error.message)
        print(f"evald worker: {result.error.kind}: {result.error.message}", file=sys.stderr, flush=True)
        return EXIT_INPUT_ERROR
    log.info(
        "worker.finished",
        result=str(spec.result_path),
        metrics={m.name: m.value for m in result.metrics},
        total_s=result.timing.total_s if result.timing else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
