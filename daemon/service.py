"""The daemon: watch, decide, run, store — until told to stop."""

from __future__ import annotations

import functools
import os
import queue
import signal
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import FrameType

import structlog

from daemon import filesystem, resources
from daemon.alerts.lifecycle import Alerter
from daemon.alerts.relay import Relay, endpoints
from daemon.config import Config, RunConfig
from daemon.discovery import Discovery, WatchedRun
from daemon.notify import SystemdNotifier
from daemon.planner import Planner
from daemon.runner import JobRunner
from daemon.timers import Timers
from daemon.watcher import Watcher
from storage import migrations, queries
from storage.database import Database, describe_url

log = structlog.get_logger("evald.service")


def open_database(config: Config) -> Database:
    """Connect, insist on the current schema, and take the single-daemon lock where one is needed."""
    database = Database(config.database.url)
    try:
        migrations.require_current(database)
        database.lock_instance()
    except BaseException:
        database.dispose()
        raise
    return database


def register_runs(config: Config, database: Database) -> list[WatchedRun]:
    watched = []
    with database.session() as session:
        for run in config.runs:
            run_id = queries.ensure_run(session, run.name, str(run.root))
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


class Service:
    def __init__(self, config: Config, database: Database) -> None:
        self.config = config
        self.database = database
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self._rescan_due = threading.Event()
        self._recover_due = threading.Event()
        self._recheck_due = threading.Event()
        self._housekeeping_due = threading.Event()
        #: Runs whose time trigger fired.
        self._time_due: queue.SimpleQueue[str] = queue.SimpleQueue()
        #: Look at the queue: at start, after a rescan (another daemon may share it) and after recovery.
        self._queue_due = threading.Event()
        self._queue_due.set()
        self.timers = Timers()

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        log.info("daemon.stopping", signal=signal.Signals(signum).name)
        self.stop_requested.set()
        self.wake.set()

    def _flag(self, event: threading.Event) -> Callable[[], None]:
        # Timer jobs only raise flags: the database and the runner stay on the main thread.
        def raise_flag() -> None:
            event.set()
            self.wake.set()

        return raise_flag

    def _time_trigger(self, run: str) -> Callable[[], None]:
        def fire() -> None:
            self._time_due.put(run)
            self.wake.set()

        return fire

    def arm_time_trigger(self, run: str, anchor_at: datetime) -> None:
        """(Re)start a run's time trigger so that it fires ``freq_secs`` after its last evaluation."""
        run_config = self.config.run(run)
        secs = self.config.scheduling.frequency_for(run_config).secs if run_config else None
        if secs is not None:
            # After a restart the first firing may be overdue: then at once, not at the next interval slot.
            first = max(anchor_at + timedelta(seconds=secs), datetime.now(UTC))
            self.timers.every(f"time:{run}", secs, self._time_trigger(run), first=first)

    def _recover(self) -> None:
        lease = timedelta(seconds=self.config.scheduling.lease_secs)
        with self.database.session() as session:
            ids = queries.recover_orphans(session, lease=lease, every_running=self.database.is_sqlite)
        if ids:
            log.warning("job.recovered", job_ids=ids, reason="its daemon stopped while it ran")

    def _arm_timers(self, planner: Planner) -> None:
        scheduling = self.config.scheduling
        self.timers.every("rescan", scheduling.rescan_secs, self._flag(self._rescan_due))
        if not self.database.is_sqlite:
            self.timers.every("recover", scheduling.lease_secs / 2, self._flag(self._recover_due))
        if scheduling.resources.thresholds().any_set:
            self.timers.every("recheck", scheduling.recheck_secs, self._flag(self._recheck_due))
        self.timers.every("housekeeping", scheduling.housekeeping_secs, self._flag(self._housekeeping_due))
        for run, anchor_at in planner.anchors().items():
            self.arm_time_trigger(run, anchor_at)

    def _guarded(self, name: str, action: Callable[[], object]) -> object:
        """One pass of timed work; a failure is logged with the pass's name and the loop goes on."""
        try:
            return action()
        except Exception as exc:
            log.exception("scheduler.pass_failed", job=name, error=repr(exc))
            return None

    def run(self) -> None:
        """The main loop; returns after a stop request, once running jobs finished or were requeued."""
        notifier = SystemdNotifier()
        self._recover()
        watched = register_runs(self.config, self.database)
        planner = Planner(self.config.scheduling, self.database, watched, on_reset=self.arm_time_trigger)
        planner.register_base_models()
        discovery = Discovery(self.database, watched, self.config.scheduling, after_ready=planner.plan)
        # Secrets are loaded before anything starts: a missing one stops the start with its name.
        relay = Relay(self.database, endpoints(self.config, os.environ)) if self.config.webhooks else None
        alerter = Alerter(self.config, wake=relay.wake if relay is not None else lambda: None)
        runner = JobRunner(
            self.config,
            self.database,
            self.owner,
            planner=planner,
            probe=resource_probe(self.config),
            alerter=alerter,
        )
        if relay is not None:
            relay.start()
        # Jobs deferred under thresholds since removed from the config would otherwise wait forever.
        runner.recheck_deferred()
        watcher = Watcher({r.name: r.root for r in self.config.runs if uses_inotify(r)}, self.wake)
        # Register what is already there before paying for the recursive watches (a restart over
        # thousands of checkpoints), then look again for whatever changed in between. Ready checkpoints
        # a crash left unplanned are planned here too.
        discovery.scan()
        planner.plan()
        watcher.start()
        discovery.scan()
        self._arm_timers(planner)
        self.timers.start()
        notifier.ready()
        log.info(
            "daemon.ready",
            database=describe_url(self.database.url),
            runs=[r.name for r in self.config.runs],
            timers=self.timers.names(),
        )
        try:
            while not self.stop_requested.is_set():
                if self._rescan_due.is_set() or watcher.overflowed.is_set():
                    self._rescan_due.clear()
                    watcher.overflowed.clear()
                    watcher.refresh()
                    self._guarded("rescan", discovery.scan)
                    self._queue_due.set()
                if self._recover_due.is_set():
                    self._recover_due.clear()
                    self._guarded("recover", self._recover)
                    self._queue_due.set()
                while not self._time_due.empty():
                    run = self._time_due.get()
                    if self._guarded(f"time:{run}", functools.partial(planner.time_tick, run)):
                        self._queue_due.set()
                if self._recheck_due.is_set():
                    self._recheck_due.clear()
                    if self._guarded("recheck", runner.recheck_deferred):
                        self._queue_due.set()
                if self._housekeeping_due.is_set():
                    self._housekeeping_due.clear()
                    self._guarded("housekeeping", runner.report_stuck)
                    if self._guarded("housekeeping", planner.finalize_quiet_runs):
                        self._queue_due.set()
                for run_name, path in watcher.drain():
                    discovery.hint(run_name, path)
                discovery.tick()
                freed = runner.poll()
                # Idle, the loop touches no database: the queue is read only when something may have changed.
                if freed or discovery.enqueued or self._queue_due.is_set():
                    discovery.enqueued = 0
                    self._queue_due.clear()
                    while runner.has_capacity() and runner.claim_and_start():
                        pass
                notifier.watchdog()
                self.wake.wait(self.config.scheduling.tick_secs)
                self.wake.clear()
        finally:
            notifier.stopping()
            runner.shutdown(self.config.scheduling.shutdown_grace_secs)
            if relay is not None:
                # Undelivered messages stay in the outbox: the next start sends them.
                relay.stop()
            self.timers.shutdown()
            watcher.stop()
            log.info("daemon.stopped")
