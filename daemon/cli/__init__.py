"""The ``evald`` command line: :func:`main` parses (:mod:`daemon.cli.parser`) and calls the command's
handler, one module per command (``export``'s formats share one), each a thin layer over config, storage,
analysis and the service; every error a person can act on ends as one line on stderr and an exit status.

Imports follow the command: the parser imports no command's module, and logging is configured only when
something imports structlog (:mod:`daemon.cli.lazy_logging`), so ``evald --help`` costs argparse alone and
each command imports what it needs, a command that logs nothing no logging (``tests/test_cli_imports.py``
counts them).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable, Sequence

from daemon.cli.parser import build_parser
from daemon.errors import ConfigError, EvaldError

__all__ = ["build_parser", "main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
#: What a shell reports for a program killed by SIGPIPE (128 + 13), as `head` expects of a writer.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    """``evald``: ``argv`` None reads this process's own command line (the ``evald`` script, ``python -m
    daemon``); a caller in a longer-lived process (the tests) passes its arguments."""
    args = build_parser().parse_args(argv)
    from daemon.cli.lazy_logging import ConfigureOnImport

    logging = ConfigureOnImport(_configure_logging)
    logging.install()
    own_process = argv is None
    if own_process:
        # Importing the command's modules makes few cycles but many objects, and the collector, walking
        # them again and again as they pile up, cost `evald run` 40 ms of its 0.5 s start: it waits until
        # they are frozen below (their garbage, about a thousand objects, frozen with them).
        gc.disable()
    try:
        handler: Callable[[argparse.Namespace], int] = args.handler.resolve()
        if own_process:
            # What the command's imports made lives until the process ends: frozen, no collection walks
            # it again, the one at exit included (a third of `evald results`' CPU time went to walking
            # SQLAlchemy's and pydantic's objects). Only for this process's own command: a caller that
            # lives on keeps its collector as it was.
            gc.freeze()
            gc.enable()
        code = handler(args)
        # Flushed here, where a reader that has gone is caught, not at exit.
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # The reader (`evald results | head`) stopped reading: the rest has nowhere to go, and the
        # interpreter's own flush at exit must not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"evald: {exc.source}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    except EvaldError as exc:
        # The worker's (InferenceError) and the database's (StorageError) errors are EvaldErrors too.
        print(f"evald: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        said = _said(exc)
        if said is None:
            raise
        print(f"evald: error: {said}", file=sys.stderr)
        return EXIT_FAILURE
    finally:
        if own_process:
            gc.enable()  # a handler that failed to import
        logging.remove()
        structlog = sys.modules.get("structlog")
        if structlog is not None:
            structlog.reset_defaults()


def _configure_logging() -> None:
    """What a command logs (``evald retry``'s ``job.retry_queued``), on stderr: stdout is its output."""
    from daemon import log as logs

    logs.configure(sys.stderr)


def _raised_by(exc: BaseException, module: str, name: str) -> bool:
    """Whether ``exc`` is ``module.name``, asked without importing ``module``: a module the command never
    imported raised nothing (SQLAlchemy's cost a command that reads no database 0.1 s)."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(exc, getattr(loaded, name))


def _said(exc: Exception) -> str | None:
    """The one line for an error of the database driver; None for any other."""
    if _raised_by(exc, "sqlalchemy.exc", "DBAPIError"):
        from storage.database import is_outage
        from storage.errors import DatabaseUnreachable, StatementFailed

        # Named for what it is: the database went away, or it refused a statement (a bug to report, not
        # something to wait out).
        orig = getattr(exc, "orig", None)
        kind = DatabaseUnreachable if is_outage(exc) else StatementFailed
        return f"{kind.__name__}: {type(orig or exc).__name__}: {_one_line(str(orig) if orig else str(exc))}"
    return None


def _one_line(text: str) -> str:
    from daemon.analysis.report import one_line

    return one_line(text)
