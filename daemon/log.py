"""structlog set-up: JSON lines for journald and files, a readable console on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure(stream: TextIO | None = None, *, fmt: LogFormat = "auto", level: str = "info") -> None:
    out = stream if stream is not None else sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Libraries (APScheduler, watchdog, alembic) log through the standard library: keep only warnings.
    logging.basicConfig(level=logging.WARNING, stream=out, format="%(levelname)s %(name)s: %(message)s")
