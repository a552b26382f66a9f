"""The ``evald`` command line: :func:`main` parses (:mod:`daemon.cli.parser`) and calls the command's
handler, one module per group of commands, each a thin layer over config, storage, analysis and the
service; every error a person can act on ends as one line on stderr and an exit status."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import structlog
from sqlalchemy.exc import DBAPIError

from daemon import log as logs
from daemon.analysis import report
from daemon.cli.parser import build_parser
from daemon.errors import ConfigError, EvaldError
from inference.errors import InferenceError
from storage.database import is_outage
from storage.errors import DatabaseUnreachable, StatementFailed, StorageError

__all__ = ["build_parser", "main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
#: What a shell reports for a program killed by SIGPIPE (128 + 13), as `head` expects of a writer.
EXIT_BROKEN_PIPE = 141


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(sys.stderr)
    try:
        code: int = args.func(args)
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
    except (EvaldError, StorageError, InferenceError) as exc:
        print(f"evald: error: {report.one_line(str(exc))}", file=sys.stderr)
        return EXIT_FAILURE
    except DBAPIError as exc:
        # One line instead of a driver traceback, named for what it is: the database went away, or it
        # refused a statement (a bug to report, not something to wait out).
        kind = DatabaseUnreachable if is_outage(exc) else StatementFailed
        reason = report.one_line(str(exc.orig) if exc.orig else str(exc))
        print(f"evald: error: {kind.__name__}: {type(exc.orig or exc).__name__}: {reason}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    finally:
        structlog.reset_defaults()
