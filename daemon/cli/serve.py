"""``evald serve``: the read-only HTTP API, the dashboard and /metrics, refused on a non-loopback address
without a token unless asked for."""

from __future__ import annotations

import argparse
import sys

import structlog

from daemon import log as logs
from daemon.cli.base import load
from daemon.errors import ConfigError
from daemon.web.exposure import open_problem
from daemon.web.server import serve


def cmd_serve(args: argparse.Namespace) -> int:
    config = load(args)
    host = args.host or config.web.host
    exposed = open_problem(config.web, host)
    if exposed is not None and not (args.insecure_no_token or config.web.allow_open):
        raise ConfigError("web.host", [f"evald serve refused: {exposed}"])
    logs.configure(sys.stdout, fmt=config.daemon.log_format, level=config.daemon.log_level)
    if exposed is not None:
        structlog.get_logger("daemon.web").warning("web.open_without_token", host=host)
    serve(config, host=host, port=args.port or config.web.port)
    return 0
