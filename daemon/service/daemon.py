"""The daemon: watch, decide, run, store — until told to stop.

The database may go away at any moment (a PostgreSQL restart, a dropped connection, a full disk). Every
pass of the main loop is one retryable unit: a :class:`DatabaseUnreachable` anywhere in it ends the pass,
the loop waits (backing off) and tries again, and the first pass that gets through rescans and looks at
the queue, so what happened meanwhile is caught up. Workers keep running through an outage and what they
return is stored when the database is back (see :class:`JobRunner`).

Every other error is asked whose it is. One job's, checkpoint's or run's error becomes that item's state
(the runner fails the job, the planner leaves the run) and the loop goes on with the rest; a bug in a piece
of the pass is logged once with its traceback, then counted (:class:`RepeatedErrors`), and the rest of the
pass still runs. The watchdog is pinged only by a pass that got to its end, or by the loop waiting out an
outage: a loop that no longer turns stops pinging, and systemd restarts it.

Leases are judged on the database's clock, and only once this daemon has been connected for a whole
lease since its last outage: a holder cut off by the same outage then had the same time to beat again
before anyone takes its job.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import structlog
from sqlalchemy import text

from daemon.analysis.repeats import RepeatedErrors
from daemon.config import Config
from daemon.outage import Outage
from daemon.running.runner import JobRunner
from daemon.scheduling.planner import Planner
from daemon.scheduling.timers import Timers
from daemon.service import recovery
from daemon.service.parts import Parts, assemble, resource_probe
from daemon.service.reload import reloaded
from daemon.service.systemd_notifier import SystemdNotifier
from storage.database import Database, describe_url
from storage.errors import DatabaseUnreachable

log = structlog.get_logger("evald.service")

#: The pause after a pass that failed for a reason other than the database, so a bug cannot spin.
PASS_FAILED_WAIT_SECS = 1.0


class Service:
    def __init__(
        self, config: Config, database: Database, reload_config: Callable[[], Config] | None = None
    ) -> None:
        self.config = config
        self.database = database
        #: Reads and validates the config file again (SIGHUP); None: reloading is not offered.
        self._reload_config = reload_config
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self.stop_requested = threading.Event()
        self.wake = threading.Event()
        self.outage = Outage(cap_secs=config.database.retry_max_secs)
        self._reload_due = threading.Event()
        self._rescan_due = threading.Event()
        #: Raised at start: jobs a dead daemon left running are looked at by the first pass.
        self._recover_due = threading.Event()
        self._recover_due.set()
        self._recheck_due = threading.Event()
        self._housekeeping_due = threading.Event()
        #: Runs whose time trigger fired.
        self._time_due: queue.SimpleQueue[str] = queue.SimpleQueue()
        #: Look at the queue: at start, after a rescan (another daemon may share it) and after recovery.
        self._queue_due = threading.Event()
        self._queue_due.set()
        self.timers = Timers()
        self.parts: Parts | None = None
        self.runner: JobRunner | None = None
        #: Errors of the loop's own passes, logged once with their traceback and then counted.
        self.errors = RepeatedErrors(log)

    def request_stop(self, signum: signal.Signals) -> None:
        """SIGTERM or SIGINT, answered on the signal thread (:mod:`daemon.service.signals`)."""
        log.info("daemon.stopping", signal=signum.name)
        self.stop_requested.set()
        self.wake.set()

    def request_reload(self, _signum: signal.Signals) -> None:
        self._reload_due.set()
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

    def _leases_judged(self) -> bool:
        """Whether other daemons' leases may be judged now: on SQLite always (the instance lock proves
        that no other daemon lives), on PostgreSQL once this daemon has been connected for a whole lease
        since its last outage (a holder cut off by the same outage is beating again by then)."""
        if self.database.is_sqlite:
            return True
        return self.outage.up_secs >= self.config.scheduling.lease_secs

    def _recover(self) -> None:
        """Requeue the jobs of daemons that died, or adopt those whose worker had already written its
        result into this daemon's state folder (:mod:`daemon.service.recovery`)."""
        assert self.runner is not None  # created by _start before the first pass
        if not self._leases_judged():
            return  # the recover timer comes back
        recovery.recover(self.database, self.config, self.runner, self.owner, self.errors)

    def _arm_timers(self, anchors: Mapping[str, datetime]) -> None:
        scheduling = self.config.scheduling
        self.timers.clear()
        self.timers.every("rescan", scheduling.rescan_secs, self._flag(self._rescan_due))
        if not self.database.is_sqlite:
            self.timers.every("recover", scheduling.recover_secs, self._flag(self._recover_due))
        if scheduling.resources.thresholds().any_set:
            self.timers.every("recheck", scheduling.recheck_secs, self._flag(self._recheck_due))
        self.timers.every("housekeeping", scheduling.housekeeping_secs, self._flag(self._housekeeping_due))
        for run, anchor_at in anchors.items():
            self.arm_time_trigger(run, anchor_at)

    def _guarded(self, name: str, action: Callable[[], object]) -> object:
        """One piece of a pass; a failure is logged with the piece's name (its traceback once, then
        counted) and the rest of the pass goes on. The database being away is not this piece's failure:
        it ends the whole pass (see :meth:`run`)."""
        try:
            return action()
        except DatabaseUnreachable:
            raise
        except Exception as exc:
            self.errors.failed("scheduler.pass_failed", exc, job=name)
            return None

    def _assemble(self, config: Config) -> Parts:
        """Everything one config needs, registered in the database but not started (no threads yet)."""
        return assemble(
            config,
            self.database,
            outage=self.outage,
            wake=self.wake,
            on_reset=self.arm_time_trigger,
            replacing=self.parts,
        )

    def _start(self, parts: Parts) -> None:
        """Swap one config's parts in: first the database work (a failure leaves everything as it was),
        then the threads.

        What is already there is registered before paying for the recursive watches (a restart over
        thousands of checkpoints), and looked at again by the first pass for whatever changed in between.
        Ready checkpoints a crash left unplanned are planned here too.
        """
        # A checkpoint or run that cannot be recorded or planned is not the start's failure: it is named
        # (once) and the rest starts; the first pass looks at everything again.
        self._guarded("rescan", parts.discovery.scan)
        self._guarded("plan", parts.planner.plan)
        anchors = parts.planner.anchors()
        if self.parts is not None:
            self.parts.stop()
        self.parts = parts
        self.config = parts.config
        probe = resource_probe(parts.config)
        if self.runner is None:
            self.runner = JobRunner(
                parts.config,
                self.database,
                self.owner,
                planner=parts.planner,
                probe=probe,
                alerter=parts.alerter,
            )
        else:
            self.runner.reconfigure(parts.config, planner=parts.planner, probe=probe, alerter=parts.alerter)
        if parts.relay is not None:
            parts.relay.start()
        parts.watcher.start()
        self._arm_timers(anchors)
        self._rescan_due.set()
        self._queue_due.set()
        # Jobs deferred under thresholds since removed from the config would otherwise wait forever.
        self._recheck_due.set()

    def _reload(self) -> None:
        """SIGHUP: build the new config's parts completely before swapping them in; a config that does
        not load or build is refused with its reason, and the old one stays in force."""
        if self._reload_config is None or self.parts is None:
            log.warning("config.reload_refused", reason="this daemon was started without a config file")
            return
        try:
            parts = reloaded(self._reload_config, self.config, self._assemble)
        except DatabaseUnreachable:
            self._reload_due.set()  # tried again once the database answers
            raise
        if parts is None:
            return
        self._start(parts)
        log.info(
            "config.reloaded",
            runs=[r.name for r in parts.config.runs],
            tasks=[t.name for t in parts.config.tasks],
            running_jobs=sorted(self.runner.running) if self.runner else [],
        )

    def _pass(self) -> None:
        """One turn of the loop: whatever is due, then the workers and the queue."""
        parts, runner = self.parts, self.runner
        assert parts is not None and runner is not None  # set by _start before the loop
        if self._reload_due.is_set():
            self._reload_due.clear()
            self._reload()
            parts = self.parts
            assert parts is not None
        planner, discovery, watcher = parts.planner, parts.discovery, parts.watcher
        # Workers first: collecting them needs no database, so timeouts hold through an outage.
        freed = self._guarded("poll", runner.poll)
        if self.outage.active:
            # Whoever saw the outage (this loop, the relay), only a pass that reached the database ends
            # it: an idle pass touches none, and would report it over while the server is still down.
            self._probe()
        if self._rescan_due.is_set() or watcher.overflowed.is_set():
            self._rescan_due.clear()
            watcher.overflowed.clear()
            watcher.refresh()
            self._retried(self._rescan_due, lambda: self._guarded("rescan", discovery.scan))
            self._queue_due.set()
        if self._recover_due.is_set():
            self._recover_due.clear()
            self._retried(self._recover_due, lambda: self._guarded("recover", self._recover))
            self._queue_due.set()
        while not self._time_due.empty():
            run = self._time_due.get()
            try:
                if self._guarded(f"time:{run}", functools.partial(planner.time_tick, run)):
                    self._queue_due.set()
            except DatabaseUnreachable:
                self._time_due.put(run)
                raise
        if self._recheck_due.is_set():
            self._recheck_due.clear()
            if self._retried(self._recheck_due, lambda: self._guarded("recheck", runner.recheck_deferred)):
                self._queue_due.set()
        if self._housekeeping_due.is_set():
            self._housekeeping_due.clear()
            self._retried(self._housekeeping_due, lambda: self._housekeeping(runner, planner))
        for run_name, path in watcher.drain():
            self._guarded(f"hint:{run_name}", functools.partial(discovery.hint, run_name, path))
        self._guarded("tick", discovery.tick)
        # Idle, the loop touches no database: the queue is read only when something may have changed.
        if freed or discovery.enqueued or self._queue_due.is_set():
            discovery.enqueued = 0
            self._queue_due.clear()
            self._retried(self._queue_due, lambda: self._guarded("claim", lambda: self._claim_all(runner)))

    def _probe(self) -> None:
        """One transaction on the database (on SQLite it takes the write lock): raises
        :class:`DatabaseUnreachable` while the database is still away."""
        with self.database.session() as session:
            session.execute(text("SELECT 1"))

    def _housekeeping(self, runner: JobRunner, planner: Planner) -> None:
        self._guarded("housekeeping", runner.report_stuck)
        if self._guarded("housekeeping", planner.finalize_quiet_runs):
            self._queue_due.set()

    def _claim_all(self, runner: JobRunner) -> None:
        while runner.has_capacity() and runner.claim_and_start():
            pass
        if runner.paused:
            # Looked at again once the pause is over (a paused runner claims nothing, for free).
            self._queue_due.set()

    @staticmethod
    def _retried(flag: threading.Event, action: Callable[[], object]) -> object:
        """Run a flagged action; if the database is away, raise the flag again so the action is redone
        when it answers."""
        try:
            return action()
        except DatabaseUnreachable:
            flag.set()
            raise

    def _caught_up(self) -> None:
        """After an outage: anything may have happened meanwhile (checkpoints written, jobs requeued by
        other daemons, hints lost), so look at everything again."""
        self._rescan_due.set()
        self._queue_due.set()
        if not self.database.is_sqlite:
            self._recover_due.set()
        if self.config.scheduling.resources.thresholds().any_set:
            self._recheck_due.set()

    def _until_started(self, notifier: SystemdNotifier) -> bool:
        """Recover, build and start the first config's parts, waiting out an outage; False if told to
        stop first."""
        while not self.stop_requested.is_set():
            try:
                self._start(self._assemble(self.config))
            except DatabaseUnreachable as exc:
                notifier.watchdog()
                self.stop_requested.wait(self.outage.failed(exc, where="start"))
                continue
            self.outage.succeeded()
            return True
        return False

    def run(self) -> None:
        """The main loop; returns after a stop request, once running jobs finished or were requeued."""
        notifier = SystemdNotifier()
        if not self._until_started(notifier):
            return
        notifier.ready()
        log.info(
            "daemon.ready",
            database=describe_url(self.database.url),
            owner=self.owner,
            runs=[r.name for r in self.config.runs],
            timers=self.timers.names(),
        )
        self.timers.start()
        try:
            while not self.stop_requested.is_set():
                try:
                    self._pass()
                except DatabaseUnreachable as exc:
                    notifier.watchdog()
                    self.stop_requested.wait(self.outage.failed(exc, where="loop"))
                    continue
                except Exception as exc:
                    # A bug in one pass must not end a week-long run's evaluations: say so (once with its
                    # traceback, then counted) and go on. No watchdog ping: this pass did not get through.
                    self.errors.failed("daemon.pass_failed", exc)
                    self._queue_due.set()
                    self.stop_requested.wait(PASS_FAILED_WAIT_SECS)
                    continue
                # A whole pass got through, the work that failed included (its flag was raised again):
                # only that ends an outage. A read that succeeds while writes still fail (a full disk)
                # does not.
                if self.outage.succeeded():
                    self._caught_up()
                notifier.watchdog()
                self.wake.wait(self.config.scheduling.tick_secs)
                self.wake.clear()
        finally:
            notifier.stopping()
            if self.runner is not None:
                self.runner.shutdown(self.config.scheduling.shutdown_grace_secs)
            if self.parts is not None:
                self.parts.stop()
            self.timers.shutdown()
            log.info("daemon.stopped")
