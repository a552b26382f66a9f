"""The MLflow sink's artifact uploads, several at a time: a batch's evaluation and alert files mostly wait
on the server, one after another they bound a backlog's drain."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

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
    location, cached by the sink) called once per run first, so that no two uploads look it up at once."""

    def __init__(
        self, name: str, upload: Callable[[str, str, bytes], None], locate: Callable[[str], object]
    ) -> None:
        self._name = name
        self._upload = upload
        self._locate = locate
        self._pool: ThreadPoolExecutor | None = None

    def run(self, files: Sequence[File]) -> list[Exception | None]:
        """What each file's upload raised (None: written), once every one has ended."""
        return self.wait(self.start(files))

    def start(self, files: Sequence[File]) -> list[Future[Exception | None] | Exception | None]:
        """The uploads begun (a run whose location cannot be read: that error for each of its files)."""
        located = {run_id: _attempt(self._locate, run_id) for run_id in {f[0] for f in files}}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(UPLOAD_WORKERS, thread_name_prefix=f"evald-mlflow-{self._name}")
        pool = self._pool
        return [located[f[0]] or pool.submit(_attempt, self._upload, *f) for f in files]

    @staticmethod
    def wait(started: Sequence[Future[Exception | None] | Exception | None]) -> list[Exception | None]:
        """What each upload ``start`` began raised (None: written). Returns when every one has ended, so
        that none of a failed batch still runs when the batch is sent again."""
        return [s.result() if isinstance(s, Future) else s for s in started]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _attempt(call: Callable[..., object], *args: object) -> Exception | None:
    try:
        call(*args)
    except Exception as exc:
        return exc
    return None
