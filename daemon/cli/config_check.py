"""``evald config check``: a config file validated as a start would (every field and dataset row), with
warnings for what only the daemon's own environment can settle."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from daemon.cli.datasets import check_datasets
from daemon.cli.devices import device_problem
from daemon.config import config_path, load_config
from daemon.errors import ConfigError
from storage.database import describe_url


def cmd_config_check(args: argparse.Namespace) -> int:
    # The file given, else the global option's (``evald --config X config check``), $EVALD_CONFIG, then
    # ./evald.toml: the same file any other command would read.
    path = Path(args.file) if args.file is not None else config_path(args.config)
    config = load_config(path)
    check_datasets(config)
    problem = device_problem(config)
    if problem is not None:
        raise ConfigError(str(path), [problem])
    database = describe_url(config.database.url)
    print(f"{path}: ok ({len(config.runs)} runs, {len(config.tasks)} tasks, database {database})")
    from daemon.web.exposure import open_problem

    exposed = open_problem(config.web, config.web.host)
    if exposed is not None:
        allowed = " (allowed by [web] allow_open = true)" if config.web.allow_open else ""
        print(f"evald: warning: web.host: {exposed}{allowed}", file=sys.stderr)
    for i, webhook in enumerate(config.webhooks):
        # Not an error: the daemon's unit may be what provides it (Environment=, LoadCredential=).
        absent = webhook.secret_absent(os.environ)
        if absent is not None:
            print(
                f"evald: warning: webhooks[{i}] ({webhook.name}): {absent}, so its secret was not checked; "
                "evald run refuses to start without it",
                file=sys.stderr,
            )
    return 0
