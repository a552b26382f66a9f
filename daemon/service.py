"""The daemon: watch, decide, run, store — until told to stop."""

from __future__ import annotations

import os
import signal
import socket
import threading
from datetime import timedelta
from types import FrameType

import structlog
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.schedulers.background import BackgroundScheduler

from daemon import filesystem
from daemon.config import Config, RunConfig
from daemon.discovery import Discovery, WatchedRun
from daemon.notify import SystemdNotifier
from daemon.runner import JobRunner
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


class Service:
    def __init__(self, config: Config, database: Database) -> None:
        self.config = config
        self.database = database
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self._rescan_due = threading.Event()
        self._recover_due = threading.Event()
        #: Look at the queue: at start, after a rescan (another daemon may share it) and after recovery.
        self._queue_due = threading.Event()
        self._queue_due.set()

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        log.info("daemon.stopping", signal=signal.Signals(signum).name)
        self.stop_requested.set()
        self.wake.set()

    def _flag(self, event: threading.Event) -> None:
        # Scheduler jobs only raise flags: the database and the runner stay on the main thread.
        event.set()
        self.wake.set()

    def _recover(self) -> None:
        lease = timedelta(seconds=self.config.scheduling.lease_secs)
        with self.database.session() as session:
            ids = queries.recover_orphans(session, lease=lease, every_running=self.database.is_sqlite)
        if ids:
            log.warning("job.recovered", job_ids=ids, reason="its daemon stopped while it ran")

    def _scheduler(self) -> BackgroundScheduler:
        scheduling = self.config.scheduling
        scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        scheduler.add_job(
            self._flag,
            "interval",
            args=[self._rescan_due],
            seconds=scheduling.rescan_secs,
            id="rescan",
            name="rescan",
        )
        if not self.database.is_sqlite:
            scheduler.add_job(
                self._flag,
                "interval",
                args=[self._recover_due],
                seconds=scheduling.lease_secs / 2,
                id="recover",
                name="recover orphaned jobs",
            )

        def on_problem(event: JobExecutionEvent) -> None:
            log.error("scheduler.job_problem", job=event.job_id, error=repr(event.exception))

        scheduler.add_listener(on_problem, EVENT_JOB_ERROR | EVENT_JOB_MISSED)
        return scheduler

    def run(self) -> None:
        """The main loop; returns after a stop request, once running jobs finished or were requeued."""
        notifier = SystemdNotifier()
        self._recover()
        discovery = Discovery(
            self.database, register_runs(self.config, self.database), self.config.scheduling
        )
        runner = JobRunner(self.config, self.database, self.owner)
        watcher = Watcher({r.name: r.root for r in self.config.runs if uses_inotify(r)}, self.wake)
        scheduler = self._scheduler()
        # Register what is already there before paying for the recursive watches (a restart over
        # thousands of checkpoints), then look again for whatever changed in between.
        discovery.scan()
        watcher.start()
        discovery.scan()
        scheduler.start()
        notifier.ready()
        log.info(
            "daemon.ready", database=describe_url(self.database.url), runs=[r.name for r in self.config.runs]
        )
        try:
            while not self.stop_requested.is_set():
                if self._rescan_due.is_set() or watcher.overflowed.is_set():
                    self._rescan_due.clear()
                    watcher.overflowed.clear()
                    watcher.refresh()
                    discovery.scan()
                    self._queue_due.set()
                if self._recover_due.is_set():
                    self._recover_due.clear()
                    self._recover()
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
            scheduler.shutdown(wait=False)
            watcher.stop()
            log.info("daemon.stopped")
