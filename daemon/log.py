"""structlog set-up: JSON lines for journald and files, a readable console on a terminal.

Libraries log through the standard library (APScheduler, watchdog, alembic, SQLAlchemy's pool with
psycopg's errors, lm-eval's task index) and Python's ``warnings`` print to stderr: both are rendered by
the same renderer as evald's own events (``logging.captureWarnings``), so that in JSON every line of the
log is one JSON object: ``{"event": ..., "logger": "sqlalchemy.pool.impl.QueuePool", "level": "error",
"exception": ...}``, a warning under the logger ``py.warnings``. So are the tracebacks Python itself
prints: an exception that ends a thread (``thread.crashed``) and one raised where nothing can catch it,
in a ``__del__`` say (``python.unraisable``).
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Literal, TextIO

import structlog

LogFormat = Literal["auto", "json", "console"]

#: The name of the standard library handler evald installs on the root logger (replaced, not added to,
#: by every later call).
HANDLER_NAME = "evald"


def configure(stream: TextIO | None = None, *, fmt: LogFormat = "auto", level: str = "info") -> None:
    out = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    _route_standard_logging(out, renderer, timestamper)


def _route_standard_logging(
    out: TextIO, renderer: structlog.typing.Processor, timestamper: structlog.typing.Processor
) -> None:
    """Standard library records (libraries' warnings and errors, kept at WARNING) and Python's warnings
    out through ``renderer`` on ``out``."""
    root = logging.getLogger()
    ours = [h for h in root.handlers if h.get_name() == HANDLER_NAME]
    if len(ours) < len(root.handlers):
        # Someone else configured logging in this process (pytest's capture): as logging.basicConfig,
        # leave it to them.
        return
    handler = logging.StreamHandler(out)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                timestamper,
                _one_message,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    for old in ours:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.captureWarnings(True)
    threading.excepthook = _thread_crashed
    sys.unraisablehook = _unraisable


def _one_message(logger: Any, name: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    # A warning's text ends with a newline (warnings.formatwarning).
    if isinstance(event.get("event"), str):
        event["event"] = event["event"].rstrip()
    return event


def _thread_crashed(args: threading.ExceptHookArgs) -> None:
    if issubclass(args.exc_type, SystemExit):
        return  # as Python's own hook: a thread that exits is not a crash
    thread = args.thread.name if args.thread is not None else None
    exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
    structlog.get_logger("evald.log").error("thread.crashed", thread=thread, exc_info=exc_info)


def _unraisable(args: Any) -> None:
    exc_info = (args.exc_type, args.exc_value, args.exc_traceback)
    where = args.err_msg or "Exception ignored in"
    structlog.get_logger("evald.log").error(
        "python.unraisable", where=where, object=repr(args.object), exc_info=exc_info
    )
