"""``evald run``: the daemon in the foreground, what systemd starts; SIGTERM and SIGINT stop it, SIGHUP
reloads its config."""

from __future__ import annotations

import argparse
import signal
import sys

import structlog

from daemon import log as logs
from daemon.cli.base import load
from daemon.cli.datasets import dataset_problems
from daemon.config import Config, config_path, load_config
from daemon.errors import ConfigError
from daemon.service import Service, open_database
from daemon.service.signals import answered_on_a_thread


def cmd_run(args: argparse.Namespace) -> int:
    config = load(args)
    problems = dataset_problems(config)
    logs.configure(sys.stdout, fmt=config.daemon.log_format, level=config.daemon.log_level)
    if problems:
        # Not fatal: each job leaves these rows out and reports them.
        structlog.get_logger("daemon.cli").warning(
            "dataset.problems", count=len(problems), first=[f"{p.where}: {p.message}" for p in problems[:5]]
        )
    database = open_database(config)
    path = config_path(args.config)

    def reload_config() -> Config:
        # The same checks as a start: the file, every field, and a dataset with no usable row. Each
        # problem names the file: config.reload_refused has nothing else to say which one it read.
        where = path.absolute()
        try:
            fresh = load_config(path)
        except ConfigError as exc:
            if not path.exists():
                raise ConfigError(
                    str(where),
                    [f"{where}: file not found (the daemon started with it: put it back and reload)"],
                ) from exc
            raise ConfigError(str(where), [f"{where}: {problem}" for problem in exc.problems]) from exc
        dataset_problems(fresh)
        return fresh

    service = Service(config, database, reload_config=reload_config)
    callbacks = {
        signal.SIGTERM: service.request_stop,
        signal.SIGINT: service.request_stop,
        signal.SIGHUP: service.request_reload,
    }
    try:
        with answered_on_a_thread(callbacks):
            service.run()
    finally:
        database.dispose()
    return 0
