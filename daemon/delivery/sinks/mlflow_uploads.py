"""The MLflow sink's artifact uploads, several at a time: a batch's evaluation and alert files mostly wait
on the server, one after another they bound a backlog's drain."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

#: Uploads in flight at once. Each evaluation's and alert's file is one small PUT that mostly waits on
#: the server; one after another they drained a 10,000-result backlog in 492 s, 8 at a time in 69 s
#: (BENCHMARKS.md).
#: 8 stays below MLflow's HTTP connection pool (``MLFLOW_HTTP_POOL_MAXSIZE``, 10), so the uploads reuse
#: kept-alive connections instead of opening one each, and is a load one tracking server takes from one
#: client.
UPLOAD_WORKERS = 8

#: (MLflow run id, artifact path, the file's bytes).
File = tuple[str, str, bytes]


class Uploads:
    """``upload`` run on many files, ``UPLOAD_WORKERS`` at a time; ``locate`` (each run's artifact
    location, cached by the sink) called once per run first, so that no two uploads look it up at once.
    Uploads of the same file go in the order begun: an alert that fired and resolved in one batch has two
    events for its one file, and the later must be the one left (two PUTs at once leave either)."""

    def __init__(
        self, name: str, upload: Callable[[str, str, bytes], None], locate: Callable[[str], object]
    ) -> None:
        self._name = name
        self._upload = upload
        self._locate = locate
        self._pool: ThreadPoolExecutor | None = None
        #: Each file's latest upload not yet ended, by (run id, path).
        self._latest: dict[tuple[str, str], Future[Exception | None]] = {}
        self._lock = threading.Lock()

    def run(self, files: Sequence[File]) -> list[Exception | None]:
        """What each file's upload raised (None: written), once every one has ended."""
        return self.wait(self.start(files))

    def start(self, files: Sequence[File]) -> list[Future[Exception | None] | Exception | None]:
        """The uploads begun (a run whose location cannot be read: that error for each of its files)."""
        located = {run_id: _attempt(self._locate, run_id) for run_id in {f[0] for f in files}}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(UPLOAD_WORKERS, thread_name_prefix=f"evald-mlflow-{self._name}")
        return [located[f[0]] or self._begin(self._pool, f) for f in files]

    def _begin(self, pool: ThreadPoolExecutor, file: File) -> Future[Exception | None]:
        key = (file[0], file[1])
        with self._lock:
            # The earlier upload was queued first, so it starts before this one waits on it: no deadlock.
            future = pool.submit(_after, self._latest.get(key), self._upload, *file)
            self._latest[key] = future
        future.add_done_callback(lambda done: self._ended(key, done))
        return future

    def _ended(self, key: tuple[str, str], done: Future[Exception | None]) -> None:
        with self._lock:
            if self._latest.get(key) is done:
                del self._latest[key]

    @staticmethod
    def wait(started: Sequence[Future[Exception | None] | Exception | None]) -> list[Exception | None]:
        """What each upload ``start`` began raised (None: written). Returns when every one has ended, so
        that none of a failed batch still runs when the batch is sent again."""
        return [s.result() if isinstance(s, Future) else s for s in started]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _after(
    earlier: Future[Exception | None] | None, upload: Callable[..., object], *args: object
) -> Exception | None:
    """``upload`` once the same file's earlier upload has ended (whatever it raised: this one replaces it)."""
    if earlier is not None:
        wait([earlier])
    return _attempt(upload, *args)


def _attempt(call: Callable[..., object], *args: object) -> Exception | None:
    try:
        call(*args)
    except Exception as exc:
        return exc
    return None
