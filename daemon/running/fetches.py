"""Downloads of claimed jobs' ``s3://`` checkpoints, off the daemon's loop, and their copies' release.

A claimed job of a run in object storage cannot start before its checkpoint is downloaded
(:func:`daemon.watching.object_cache.local_copy`: seconds to many minutes). The download runs on a
thread of its own while the loop goes on (discovery, the other jobs' leases and results, the relay); the
job holds its claim and its slot meanwhile, its lease kept fresh as a running job's, and starts at the
first pass after its copy is complete. One download at a time: the cache takes one at a time anyway, and
a second would only share the same bandwidth. A claim lost meanwhile, or the daemon stopping, stops its
download within a chunk. A download that fails because the store is away (or an object was replaced
mid-download, or the cache is full of copies in use) gives its job back to the queue without spending an
attempt, and its run's jobs rest (1, 2, 4 ... s in a row, up to a minute) while the other runs' go on; a
checkpoint deleted from the store ends as vanished; one larger than the cache fails.

Each claim pins the copy it uses. :meth:`Fetches.sweep` releases the pins of claims that are over (the
job stored, failed, requeued or taken over, read from the database: the pins of a daemon that died are
released too), and evicts a released copy unless another job of the same checkpoint still waits for it
(another task, a retry): copies are evicted after use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from daemon.config import Config, RunConfig
from daemon.running import lease
from daemon.running.recording import Recorder
from daemon.watching import object_cache
from inference.spec import JobSpec
from storage import queries
from storage.database import Database
from storage.errors import DatabaseUnreachable

log = structlog.get_logger("evald.runner")

#: How often pins are compared with the database when no job ended meanwhile, in seconds.
SWEEP_SECS = 30.0
#: The longest a run rests after its store failed a download, in seconds (1, 2, 4, ... in a row).
STORE_REST_MAX_SECS = 60.0
_PIN_PREFIX = "job-"


def pin_key(job: queries.ClaimedJob) -> str:
    """The pin of one claim of a job (its fencing token in the name: a new claim pins anew)."""
    return f"{_PIN_PREFIX}{job.id}-{job.attempts}"


def parse_pin(key: str) -> tuple[int, int] | None:
    """``(job id, claim)`` of a pin this module wrote; None for any other name."""
    job, _, claim = key.removeprefix(_PIN_PREFIX).partition("-")
    if not key.startswith(_PIN_PREFIX) or not job.isdigit() or not claim.isdigit():
        return None
    return int(job), int(claim)


def object_run(config: Config, job: queries.ClaimedJob) -> RunConfig | None:
    """The job's run when its checkpoints are in object storage (they must be downloaded first)."""
    run = config.run(job.run)
    return run if run is not None and run.url is not None and run.s3 is not None else None


@dataclass
class Fetch:
    """One claimed job whose checkpoint is being downloaded (what its lease needs: ``job``, ``config``,
    ``last_heartbeat``)."""

    job: queries.ClaimedJob
    config: Config
    run: RunConfig
    #: The job's spec, its checkpoint still the mirror's path: the copy's goes in once downloaded.
    spec: JobSpec
    future: Future[Path]
    stop: threading.Event
    started: float = field(default_factory=time.monotonic)
    last_heartbeat: float = field(default_factory=time.monotonic)


#: Starts a job whose spec is complete (the runner's dispatcher, with the executor of the moment).
Launch = Callable[[queries.ClaimedJob, JobSpec, Config], None]


class Fetches:
    """The downloads under way, and the sweep of pins (see the module's docstring)."""

    def __init__(self, database: Database, owner: str, recorder: Recorder, launch: Launch) -> None:
        self._db = database
        self._owner = owner
        self._recorder = recorder
        self._launch = launch
        self.under_way: dict[int, Fetch] = {}
        #: Runs whose store failed a download: none of their jobs is claimed before then (run id →
        #: monotonic time), and how many failed in a row.
        self._resting: dict[int, float] = {}
        self._store_failures: dict[int, int] = {}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="evald-fetch")
        self._swept = time.monotonic()
        #: Cache folders seen, so a sweep still looks at one whose run left the config.
        self._caches: set[Path] = set()
        #: Copies released while a download held the cache (cache folder, checkpoint): tried again.
        self._unevicted: dict[Path, tuple[Path, str]] = {}

    def start(self, config: Config, job: queries.ClaimedJob, run: RunConfig, spec: JobSpec) -> None:
        assert run.s3 is not None and run.url is not None  # object_run checked
        stop = threading.Event()
        checkpoint = Path(job.checkpoint_path)
        future = self._pool.submit(object_cache.local_copy, run, checkpoint, pin=pin_key(job), stop=stop)
        self.under_way[job.id] = Fetch(job, config, run, spec, future, stop)
        self._caches.add(run.s3.cache_dir)
        # In no mirror of the run's URL (its root changed by a reload): the download says so, as the job's.
        name = run.s3.name_in_mirror(run.url, checkpoint)
        url = f"{run.url}/{name}" if name else f"{run.url} ({checkpoint})"
        self._say(job, f"downloading its checkpoint from {url}")
        log.info("objects.fetch_started", job_id=job.id, run=job.run, step=job.step, url=url)

    def _say(self, job: queries.ClaimedJob, state: str | None) -> None:
        """What the claim waits for, shown by ``evald history`` (fenced by the claim, as a heartbeat); a
        courtesy: the database away or refusing it changes nothing else."""
        try:
            with self._db.session() as session:
                queries.set_executor_state(
                    session, job_id=job.id, owner=self._owner, attempt=job.attempts, state=state
                )
        except Exception as exc:
            log.warning("objects.fetch_state_unsaid", job_id=job.id, error=f"{type(exc).__name__}: {exc}")

    def resting(self) -> frozenset[int]:
        """The runs whose jobs are not claimed now (their store just failed a download)."""
        now = time.monotonic()
        return frozenset(run for run, until in self._resting.items() if until > now)

    def poll(self, now: float) -> int:
        """Start the jobs whose checkpoint is downloaded, requeue or fail those that could not be, and
        keep the others' leases fresh; how many runs' rests ended (their jobs may be claimed again)."""
        for fetch, got in self.done():
            job = fetch.job
            if isinstance(got, Path):
                log.info(
                    "objects.fetched",
                    job_id=job.id,
                    run=job.run,
                    step=job.step,
                    path=str(got),
                    secs=round(time.monotonic() - fetch.started, 3),
                )
                self._store_failures.pop(job.run_id, None)
                self._say(job, None)
                self._launch(job, fetch.spec.model_copy(update={"checkpoint_path": got}), fetch.config)
                continue
            self.release(fetch)
            if isinstance(got, object_cache.CopyFailed):
                self._copy_failed(job, got, fetch.config.inference.max_attempts)
            elif isinstance(got, Exception):
                self._recorder.setup_failed(job, got)
            else:
                raise got
        held = self.under_way.values()
        lease.renew(self._db, self._owner, held, now, lost=self._lost, refused=self._refused)
        rested = [run for run, until in self._resting.items() if until <= now]
        for run in rested:
            del self._resting[run]
        return len(rested)

    def _copy_failed(self, job: queries.ClaimedJob, exc: object_cache.CopyFailed, max_attempts: int) -> None:
        if exc.corrupt:
            retry = job.attempts < max_attempts
            self._recorder.fail(
                job, "checkpoint_invalid", f"could not download the checkpoint: {exc}", None, retry=retry
            )
            return
        if exc.transient:
            self._recorder.requeue(job, error_kind="store_unavailable", error=str(exc))
            failures = self._store_failures.get(job.run_id, 0) + 1
            self._store_failures[job.run_id] = failures
            pause = min(STORE_REST_MAX_SECS, 2.0 ** (failures - 1))
            self._resting[job.run_id] = time.monotonic() + pause
            log.warning(
                "objects.copy_deferred",
                job_id=job.id,
                run=job.run,
                step=job.step,
                error=str(exc),
                retry_secs=pause,
            )
            return
        kind = "checkpoint_vanished" if exc.vanished else "setup"
        self._recorder.fail(job, kind, f"could not download the checkpoint: {exc}", None)

    def _lost(self, fetch: Fetch) -> None:
        """A claim lost while its checkpoint was downloading: the download stops, nothing starts."""
        self.drop(fetch)
        job = fetch.job
        log.warning(
            "job.lost_lease",
            job_id=job.id,
            run=job.run,
            step=job.step,
            attempt=job.attempts,
            doing="downloading its checkpoint",
        )

    def _refused(self, fetch: Fetch, exc: Exception) -> None:
        """The database refuses the heartbeat of a job whose checkpoint is downloading: it fails."""
        self.drop(fetch)
        self._recorder.setup_failed(fetch.job, exc)

    def shutdown(self, wait_secs: float) -> None:
        """The daemon stops: every job still downloading goes back to the queue as it was (nothing ran),
        and the downloads stop within ``wait_secs``."""
        for fetch in list(self.under_way.values()):
            self.drop(fetch)
            try:
                self._recorder.requeue(fetch.job)
            except DatabaseUnreachable as exc:
                log.error("job.not_requeued", job_id=fetch.job.id, run=fetch.job.run, error=str(exc))
                continue
            log.info("job.requeued", job_id=fetch.job.id, run=fetch.job.run, step=fetch.job.step)
        self._close(wait_secs)

    def done(self) -> list[tuple[Fetch, Path | BaseException]]:
        """The downloads that ended since the last call, each with its copy or what went wrong."""
        ended = []
        for job_id, fetch in list(self.under_way.items()):
            if not fetch.future.done():
                continue
            del self.under_way[job_id]
            error = fetch.future.exception()
            ended.append((fetch, error if error is not None else fetch.future.result()))
        return ended

    def drop(self, fetch: Fetch) -> None:
        """Stop ``fetch``'s download (its claim is over) and let go of its pin."""
        self.under_way.pop(fetch.job.id, None)
        fetch.stop.set()
        self.release(fetch)

    def release(self, fetch: Fetch) -> None:
        assert fetch.run.s3 is not None
        object_cache.release(fetch.run.s3.cache_dir, pin_key(fetch.job))

    def _close(self, wait_secs: float) -> None:
        """Wait up to ``wait_secs`` for the stopped downloads' threads to end."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + wait_secs
        while any(t.is_alive() for t in threading.enumerate() if t.name.startswith("evald-fetch")):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)

    # --- after use --------------------------------------------------------------------------------------

    def sweep(self, runs: Iterable[RunConfig], held: Collection[int], *, now: bool) -> int:
        """Release the pins of claims that are over and evict their copies unless still wanted; every
        :data:`SWEEP_SECS`, or ``now`` (a job just ended). ``held``: the jobs this daemon runs or fetches
        (their pins stand without asking). Returns how many copies were evicted; a cache folder that
        cannot be read is logged, not the loop's failure."""
        if not now and time.monotonic() - self._swept < SWEEP_SECS:
            return 0
        self._swept = time.monotonic()
        for run in runs:
            if run.s3 is not None and run.url is not None:
                self._caches.add(run.s3.cache_dir)
        evicted = 0
        for cache_dir in sorted(self._caches):
            try:
                evicted += self._sweep_cache(self._db, cache_dir, held)
            except OSError as exc:
                log.error("objects.sweep_failed", cache_dir=str(cache_dir), error=str(exc))
        return evicted

    def _sweep_cache(self, database: Database, cache_dir: Path, held: Collection[int]) -> int:
        found = object_cache.pins(cache_dir)
        claims = {pin.key: parse_pin(pin.key) for pin in found}
        asked = {c[0] for c in claims.values() if c is not None and c[0] not in held}
        with database.session() as session:
            running = queries.running_claims(session, asked)
        over = [
            pin
            for pin in found
            if (claim := claims[pin.key]) is not None
            and claim[0] not in held
            and running.get(claim[0]) != claim[1]
        ]
        for pin in over:
            object_cache.release(cache_dir, pin.key)
        standing = {pin.copy for pin in found} - {pin.copy for pin in over}
        released = {pin.copy: pin.checkpoint for pin in over if pin.copy not in standing}
        released.update(
            (copy, checkpoint)
            for copy, (folder, checkpoint) in self._unevicted.items()
            if folder == cache_dir and copy not in standing
        )
        if not released:
            return 0
        with database.session() as session:
            wanted = queries.checkpoints_in_use(session, set(released.values()))
        evicted = 0
        for copy, checkpoint in released.items():
            self._unevicted.pop(copy, None)
            if checkpoint in wanted:
                continue
            done = object_cache.evict_unused(cache_dir, copy)
            if done == "busy":
                self._unevicted[copy] = (cache_dir, checkpoint)
            evicted += done == "evicted"
        return evicted
