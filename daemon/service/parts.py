"""What one config builds for the daemon: its runs registered, planner, discovery, relay, alerter, watcher.

Built completely, registered in the database but not started (no threads), so that a reload whose config
cannot be built leaves the running parts untouched.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import structlog

from daemon.alerts.lifecycle import Alerter
from daemon.config import Config, RunConfig
from daemon.delivery.relay import Relay, routes
from daemon.outage import Outage
from daemon.scheduling import resources
from daemon.scheduling.planner import Planner
from daemon.watching import filesystem
from daemon.watching.discovery import Discovery
from daemon.watching.runs import WatchedRun
from daemon.watching.watcher import Watcher
from storage import queries
from storage.database import Database

log = structlog.get_logger("evald.service")


@dataclass
class Parts:
    """What one config builds; a reload builds a new set and swaps it in (the runner stays)."""

    config: Config
    planner: Planner
    discovery: Discovery
    relay: Relay | None
    alerter: Alerter
    watcher: Watcher

    def stop(self) -> None:
        if self.relay is not None:
            # Undelivered messages stay in the outbox: the next start (or the new relay) sends them.
            self.relay.stop()
        self.watcher.stop()


def assemble(
    config: Config,
    database: Database,
    *,
    outage: Outage,
    wake: threading.Event,
    on_reset: Callable[[str, datetime], None],
    replacing: Parts | None = None,
) -> Parts:
    """Everything one config needs, registered in the database but not started (no threads yet);
    ``replacing``: the parts a reload replaces, whose paused s3 runs stay paused until they answer."""
    watched = register_runs(config, database)
    planner = Planner(config.scheduling, database, watched, on_reset=on_reset)
    planner.register_base_models()
    paused = replacing.discovery.paused() if replacing is not None else None
    discovery = Discovery(database, watched, config.scheduling, after_ready=planner.plan, paused=paused)
    # Secrets are loaded before anything starts: a missing one stops the start (or the reload).
    relay = (
        Relay(
            database,
            routes(config, os.environ, before=replacing.config if replacing is not None else None),
            outage=outage,
        )
        if config.webhooks or config.trackers
        else None
    )
    alerter = Alerter(config, wake=relay.wake if relay is not None else lambda: None)
    watcher = Watcher({r.name: r.root for r in config.runs if uses_inotify(r)}, wake)
    return Parts(config, planner, discovery, relay, alerter, watcher)


def register_runs(config: Config, database: Database) -> list[WatchedRun]:
    watched = []
    with database.session() as session:
        for run in config.runs:
            # What the user configured: an s3:// run's root is its local mirror, not where it lives.
            run_id = queries.ensure_run(session, run.name, run.url or str(run.root))
            watched.append(WatchedRun(run, run_id, tuple(t.name for t in config.tasks_for(run))))
    return watched


def uses_inotify(run: RunConfig) -> bool:
    """``auto`` watches with inotify unless the root is on a network filesystem, where it would miss
    every write made by another host."""
    if run.watch_mode == "auto":
        network = filesystem.is_network(run.root)
        if network:
            log.info("watcher.polling", run=run.name, root=str(run.root), reason="network filesystem")
        return not network
    return run.watch_mode == "inotify"


def resource_probe(config: Config) -> resources.ResourceProbe | None:
    settings = config.scheduling.resources
    thresholds = settings.thresholds()
    if not thresholds.any_set:
        return None
    return resources.ResourceProbe(
        thresholds,
        uses_gpu=config.inference.device != "cpu",
        gpu_indices=resources.visible_gpu_indices(settings.gpus, os.environ),
    )
