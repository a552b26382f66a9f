"""The MLflow sink: each evaluation's values logged at the checkpoint's training step, the run kept
readable.

Metrics are the plotted values only, ``eval/<task>/<metric>`` (a quick subset's under
``eval/<task>/quick/``); stderr and n, the checkpoint's path and the ids are in the evaluation's file
``evald/evaluations/<task>/step_<step>_job_<id>.json``, and the run gets a bounded set of tags, whatever the
number of evaluations and alerts (``mlflow_record``). Consecutive evaluations of one run share one
``log_batch``. Delivery is idempotent: each value carries the evaluation's own finish time as its
timestamp, so a batch sent again (a crash before the outbox's mark) repeats the same (key, step, timestamp,
value), which MLflow's store keeps once; files are written again at the same path and tags set to the same
value. The evaluation's file is written after its values, so its presence says they are there; a batch's
files are written several at a time (``mlflow_uploads``) once its values are logged, and a message counts as
delivered only when its files and those of every message before it are written.

An alert event is its file ``evald/alerts/alert_<id>.json`` (its latest event) and its place in the tag
``evald.alerts.firing``.

The samples go as one table per evaluation (``sample_path``, MLflow's table format, the checkpoint in each
row), every call with the sink's own credentials.

The run is the trainer's where it can be found (``mlflow_attach``: ``run_ids``, the files and local stores
a trainer leaves under the run root, the server's search), checked to exist; else one own run per evald
run, found again by its ``evald.run`` tag after a restart. ``mlflow`` is imported here only: it is an
optional extra.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from daemon.config import TrackerConfig
from daemon.delivery.base import Batch, Sink
from daemon.delivery.errors import SinkError, SinkRefused, SinkRejected, SinkUnavailable
from daemon.delivery.messages import AlertEvent, Message, ResultMessage
from daemon.delivery.sinks.mlflow_attach import on_disk, search_filter
from daemon.delivery.sinks.mlflow_record import (
    RUN_TAG,
    RunRecord,
    alert_path,
    evaluation_path,
    evaluation_record,
)
from daemon.delivery.sinks.mlflow_tables import (
    LOGGED_ARTIFACTS,
    listed_tables,
    put_artifact,
    sample_path,
    sample_table,
)
from daemon.delivery.sinks.mlflow_uploads import Uploads

log = structlog.get_logger("daemon.delivery.sinks.mlflow")

#: MLflow's limit on a tag's value.
TAG_CHARS = 5000
#: MLflow's ``log_batch`` limits: 1,000 metrics, params and tags together.
MAX_ENTITIES = 1000
#: The tags each ``log_batch`` sets (``RunRecord.tags``).
EVALD_TAGS = 3


@dataclass(frozen=True)
class _Entry:
    """One message's share of a ``log_batch`` and the files written with it."""

    message: Message
    metrics: tuple[Any, ...]
    #: The evaluation's or alert's file: (path, JSON).
    record: tuple[str, bytes]

    @property
    def size(self) -> int:
        return len(self.metrics)


@dataclass(frozen=True)
class _Logged:
    """A chunk whose values and tags are logged: its files still to write, then its run's record to keep."""

    run_id: str
    chunk: list[_Entry]
    after: RunRecord


def _classify(exc: Exception, doing: str) -> SinkError:
    """MLflow's error as the relay's: refused credentials pause, a bad message is given up, the rest
    is tried again."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        status = exc.get_http_status_code()  # type: ignore[no-untyped-call]
        text = str(exc).splitlines()[0][:300]
        if status in (401, 403):
            return SinkRefused(f"{doing}: credentials refused (HTTP {status}): {text}")
        if status == 400 and "INVALID_PARAMETER_VALUE" in exc.error_code and doing.startswith("log"):
            return SinkRejected(f"{doing}: {text}")
        return SinkUnavailable(f"{doing}: {text}")
    return SinkUnavailable(f"{doing}: {type(exc).__name__}: {str(exc)[:300]}")


class MlflowSink(Sink[Message]):
    def __init__(self, config: TrackerConfig, environ: Mapping[str, str]) -> None:
        # No retries inside MLflow's client (its default backs off for minutes): the relay retries, with
        # the outbox keeping the message, and one call must end within the tracker's timeout.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        # MLflow reads both from the environment at each request: process-wide, so the newest sink's
        # timeout holds for all (one MLflow tracker per daemon is the usual case).
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, int(config.timeout_secs)))
        self.name = config.name
        self._config = config
        self._uri = config.tracking_uri or ""
        token = environ.get(config.token_env, "") if config.token_env else ""
        user = environ.get(config.user_env, "") if config.user_env else ""
        for named, value in ((config.token_env, token), (config.user_env, user)):
            if named is not None and not value:
                # Refused, not down: the sink pauses with this line instead of retrying every second.
                raise SinkRefused(f"environment variable {named} is not set or empty")
        #: The sink's own credentials (never in the environment), for the artifact uploads too.
        self._token, self._user = token or None, user or None
        #: Each run's artifact location (``_artifact_location``).
        self._artifact_roots: dict[str, tuple[bool, str]] = {}
        self._store = self._make_store(self._token, self._user)
        #: evald run -> MLflow run id, and what each MLflow run's evald tags say (``RunRecord``).
        self._runs: dict[str, str] = {}
        self._records: dict[str, RunRecord] = {}
        self._experiment_id: str | None = None
        self._uploads = Uploads(self.name, self._upload, self._artifact_location)

    def _make_store(self, token: str | None, user: str | None) -> Any:
        if self._uri.startswith(("http://", "https://")):
            from mlflow.store.tracking.rest_store import RestStore
            from mlflow.utils.rest_utils import MlflowHostCreds

            # The token goes in this store's credentials only: not into the environment, where MLflow
            # would look for it, and from where nothing may pass it on.
            creds = (
                MlflowHostCreds(self._uri, username=user, password=token)  # type: ignore[no-untyped-call]
                if user is not None
                else MlflowHostCreds(self._uri, token=token)  # type: ignore[no-untyped-call]
            )
            return RestStore(lambda: creds)  # type: ignore[no-untyped-call]
        from mlflow.tracking._tracking_service.utils import _get_store

        return _get_store(self._uri)  # type: ignore[no-untyped-call]

    def where(self, run: str) -> str:
        run_id = self._runs.get(run)
        base = self._uri.rstrip("/")
        if run_id is None or self._experiment_id is None:
            return f"MLflow {base} (experiment {self._config.experiment})"
        return f"MLflow {base}/#/experiments/{self._experiment_id}/runs/{run_id}"

    def close(self) -> None:
        self._runs.clear()
        self._records.clear()
        self._uploads.close()

    def run_id(self, message: Message) -> str:
        """The MLflow run ``message``'s evald run logs into (found or created once per sink)."""
        known = self._runs.get(message.run)
        if known is not None:
            return known
        run_id = None
        if self._config.attach == "trainer":
            run_id = self._trainer_run(message)
        if run_id is None:
            run_id = self._own_run(message)
        # Read before the run is remembered: a read that fails (a timeout) is retried with the lookup,
        # never left as a known run without its tags.
        try:
            tags = dict(self._store.get_run(run_id).data.tags)
        except Exception as exc:
            raise _classify(exc, f"read run {run_id}") from exc
        self._runs[message.run] = run_id
        self._records[run_id] = RunRecord.from_tags(tags)
        return run_id

    def _trainer_run(self, message: Message) -> str | None:
        """The first candidate (``mlflow_attach``'s order) that exists on the server and is not deleted."""
        candidates: list[tuple[str, str]] = []
        configured = self._config.run_ids.get(message.run)
        if configured:
            candidates.append(("run_ids", configured))
        found, problems = on_disk(Path(message.run_root))
        for problem in problems:
            log.warning("tracker.trainer_run_unreadable", tracker=self.name, run=message.run, error=problem)
        candidates += found
        for where, candidate in candidates:
            if self._usable(message, candidate, where):
                return self._attached(message, candidate, where)
        searched = self._search_trainer_run(message)
        if searched is not None:
            return self._attached(message, *searched)
        return None

    def _attached(self, message: Message, run_id: str, where: str) -> str:
        log.info("tracker.attached", tracker=self.name, run=message.run, trainer_run=run_id, found_in=where)
        return run_id

    def _usable(self, message: Message, candidate: str, where: str) -> bool:
        """Whether ``candidate`` is a live run on the server (else one ``trainer_run_missing`` line)."""
        from mlflow.exceptions import MlflowException

        try:
            run = self._store.get_run(candidate)
        except MlflowException as exc:
            status = exc.get_http_status_code()  # type: ignore[no-untyped-call]
            # 404 from a server; a local store says RESOURCE_DOES_NOT_EXIST (also 404) or, for an id it
            # cannot even parse, INVALID_PARAMETER_VALUE.
            if status == 404 or (status == 400 and exc.error_code == "INVALID_PARAMETER_VALUE"):
                self._missing(message, candidate, where, "does not exist on this server")
                return False
            raise _classify(exc, "get the trainer's run") from exc
        except Exception as exc:
            raise _classify(exc, "get the trainer's run") from exc
        if run.info.lifecycle_stage == "deleted":
            self._missing(message, candidate, where, "is deleted")
            return False
        self._experiment_id = run.info.experiment_id
        return True

    def _missing(self, message: Message, candidate: str, where: str, why: str) -> None:
        log.warning(
            "tracker.trainer_run_missing",
            tracker=self.name,
            run=message.run,
            trainer_run=candidate,
            found_in=where,
            detail=f"the trainer's MLflow run {why}: logging to an own run",
        )

    def _search_trainer_run(self, message: Message) -> tuple[str, str] | None:
        """The newest active run in ``experiment`` that the trainer's name and tags (or, without them, HF
        Trainer's ``output_dir`` parameter) pick out, with what was searched for."""
        from mlflow.entities import ViewType

        config = self._config
        query, what = search_filter(
            run=message.run, root=message.run_root, run_name=config.trainer_run_name, tags=config.trainer_tags
        )
        try:
            experiment = self._store.get_experiment_by_name(config.experiment)
            if experiment is None or experiment.lifecycle_stage == "deleted":
                return None
            found = self._store.search_runs(
                experiment_ids=[experiment.experiment_id],
                filter_string=query,
                run_view_type=ViewType.ACTIVE_ONLY,
                max_results=1,
                order_by=["attributes.start_time DESC"],
            )
        except Exception as exc:
            raise _classify(exc, f"search experiment {config.experiment!r} for the trainer's run") from exc
        if not found:
            return None
        self._experiment_id = str(experiment.experiment_id)
        return str(found[0].info.run_id), f"search in experiment {config.experiment!r}: {what}"

    def _experiment(self) -> str:
        if self._experiment_id is not None:
            return self._experiment_id
        try:
            found = self._store.get_experiment_by_name(self._config.experiment)
            if found is not None and found.lifecycle_stage != "deleted":
                self._experiment_id = str(found.experiment_id)
            else:
                self._experiment_id = str(self._store.create_experiment(self._config.experiment))
        except Exception as exc:
            raise _classify(exc, f"get experiment {self._config.experiment!r}") from exc
        return self._experiment_id

    def _own_run(self, message: Message) -> str:
        from mlflow.entities import RunTag, ViewType

        experiment = self._experiment()
        try:
            # Found again after a restart by its tag: one own run per evald run, never a second.
            found = self._store.search_runs(
                experiment_ids=[experiment],
                filter_string=f"tags.`{RUN_TAG}` = '{message.run}'",
                run_view_type=ViewType.ACTIVE_ONLY,
                max_results=1,
            )
            if found:
                return str(found[0].info.run_id)
            run = self._store.create_run(
                experiment_id=experiment,
                user_id="evald",
                start_time=int(time.time() * 1000),
                tags=[
                    RunTag(RUN_TAG, message.run),
                    RunTag("evald.root", message.run_root[:TAG_CHARS]),
                    RunTag("mlflow.source.name", "evald"),
                ],
                run_name=f"evald-{message.run}",
            )
        except Exception as exc:
            raise _classify(exc, f"find or create the run of {message.run!r}") from exc
        log.info("tracker.own_run", tracker=self.name, run=message.run, mlflow_run=run.info.run_id)
        return str(run.info.run_id)

    def deliver_many(self, items: Sequence[tuple[str, Message]]) -> Batch:
        """Consecutive messages of one MLflow run go in one ``log_batch`` while it stays within MLflow's
        limit (1,000 entities); an evaluation of more values than one call takes goes alone, in several
        (``_log``). Each chunk's files are begun once its values are logged, while the next chunks are
        logged (``_write_files``)."""
        logged: list[_Logged] = []
        pending: dict[str, RunRecord] = {}
        stopped: SinkError | None = None
        started: list[list[Future[Exception | None] | Exception | None]] = []
        chunk: list[_Entry] = []
        chunk_run: str | None = None
        try:
            for event_id, message in items:
                run_id = self.run_id(message)
                entry = self._entry(event_id, message)
                fits = sum(e.size for e in chunk) + entry.size + EVALD_TAGS <= MAX_ENTITIES
                if chunk and (run_id != chunk_run or not fits):
                    logged.append(self._log(chunk_run or run_id, chunk, pending))
                    started.append(
                        self._uploads.start([(logged[-1].run_id, *e.record) for e in logged[-1].chunk])
                    )
                    chunk = []
                chunk_run = run_id
                chunk.append(entry)
            if chunk:
                logged.append(self._log(chunk_run or "", chunk, pending))
                started.append(
                    self._uploads.start([(logged[-1].run_id, *e.record) for e in logged[-1].chunk])
                )
        except SinkError as exc:
            stopped = exc
        # The chunks logged before a failure are delivered too, once their files are written.
        fresh, unwritten = self._write_files(logged, started)
        return Batch(tuple(fresh), unwritten or stopped)

    def _entry(self, event_id: str, message: Message) -> _Entry:
        from mlflow.entities import Metric

        if isinstance(message, AlertEvent):
            facts = json.dumps(message.facts(event_id), allow_nan=False, default=str, indent=1)
            return _Entry(message, (), (alert_path(message), facts.encode()))
        # The evaluation's own time, not the sending time: a value sent again has the same key, value,
        # step and timestamp, which MLflow's store keeps once.
        stamp = message.finished_ms if message.finished_ms is not None else int(time.time() * 1000)
        metrics = tuple(
            Metric(key=message.key(m.name), value=m.value, timestamp=stamp, step=message.step)
            for m in message.metrics
        )
        record = json.dumps(evaluation_record(event_id, message), allow_nan=False, indent=1)
        return _Entry(message, metrics, (evaluation_path(message), record.encode()))

    def _log(self, run_id: str, chunk: list[_Entry], pending: dict[str, RunRecord]) -> _Logged:
        """The sample tables, then one ``log_batch`` of the values and evald's tags; the evaluations' and
        alerts' files are left to ``_write_files`` (written after: a file on the run says its values are
        there). ``pending``: each run's record as this batch's logged chunks leave it."""
        from mlflow.entities import RunTag

        metrics = [m for e in chunk for m in e.metrics]
        record = pending.get(run_id) or self._records.setdefault(run_id, RunRecord())
        after = RunRecord(record.last_step, dict(record.firing))
        for entry in chunk:
            after.apply(entry.message)
        tags = [RunTag(key, value) for key, value in after.tags(TAG_CHARS).items()]
        try:
            self._log_samples(
                run_id,
                [e.message for e in chunk if isinstance(e.message, ResultMessage) and e.message.samples],
            )
            # One call, unless one evaluation alone has more values than MLflow takes in a call: then its
            # values in several, the tags in the last (a crash between them sends the values again,
            # which their timestamps make the same rows).
            parts = [metrics[i : i + MAX_ENTITIES] for i in range(0, len(metrics), MAX_ENTITIES)] or [[]]
            if len(parts[-1]) + len(tags) > MAX_ENTITIES:
                parts.append([])
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                if part or last:
                    self._store.log_batch(run_id, metrics=part, params=[], tags=tags if last else [])
        except SinkError as exc:
            self._forget_runs(chunk, exc)
            raise
        except Exception as exc:
            error = _classify(exc, "log_batch")
            self._forget_runs(chunk, error)
            raise error from exc
        pending[run_id] = after
        return _Logged(run_id, chunk, after)

    def _write_files(
        self, logged: list[_Logged], started: list[list[Future[Exception | None] | Exception | None]]
    ) -> tuple[list[bool], SinkError | None]:
        """Waits for every logged chunk's evaluation and alert files (``started``: their uploads, begun
        ``UPLOAD_WORKERS`` at a time): the chunks before the first one with a file not written are delivered
        (their runs' records kept); that file's error stops the rest, which are sent again, files and all."""
        fresh: list[bool] = []
        error: SinkError | None = None
        for item, uploads in zip(logged, started, strict=True):
            for entry, exc in zip(item.chunk, self._uploads.wait(uploads), strict=True):
                if exc is not None and error is None:
                    error = (
                        exc
                        if isinstance(exc, SinkError)
                        else _classify(exc, f"log the file {entry.record[0]}")
                    )
                    self._forget_runs(item.chunk, error)
            if error is None:
                self._records[item.run_id] = item.after
                fresh += [True] * len(item.chunk)
        return fresh, error

    def _log_samples(self, run_id: str, messages: list[ResultMessage]) -> None:
        """Each message's sample table as an artifact in MLflow's table format (overwritten, not doubled,
        when sent again), then listed in the run's ``mlflow.loggedArtifacts`` tag, MLflow's table view."""
        paths = [sample_path(message) for message in messages]
        tables = [json.dumps(sample_table(message)).encode() for message in messages]
        for exc in self._uploads.run([(run_id, p, t) for p, t in zip(paths, tables, strict=True)]):
            if isinstance(exc, SinkError):
                raise exc
            if exc is not None:
                # Never "rejected": a table MLflow refuses is retried, not a reason to give the values up.
                raise _classify(exc, "upload the sample tables") from exc
        try:
            if paths:
                self._list_tables(run_id, paths)
        except Exception as exc:
            raise _classify(exc, "upload the sample tables") from exc

    def _upload(self, run_id: str, path: str, data: bytes) -> None:
        """One artifact, with the sink's credentials where the server proxies artifacts; else written to
        the run's artifact store itself (a folder, ``s3://``…) with that store's own credentials: never
        through a client that asks the tracking server without the sink's credentials."""
        proxied, uri = self._artifact_location(run_id)
        if proxied:
            put_artifact(uri, path, data, user=self._user, token=self._token)
            return
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        where = PurePosixPath(path)
        with tempfile.TemporaryDirectory(prefix="evald-mlflow-") as folder:
            local = Path(folder) / where.name
            local.write_bytes(data)
            get_artifact_repository(uri).log_artifact(str(local), str(where.parent))  # type: ignore[no-untyped-call]

    def _list_tables(self, run_id: str, paths: list[str]) -> None:
        """``paths`` added to the run's ``mlflow.loggedArtifacts``, read just before (the trainer may list
        its own tables there)."""
        from mlflow.entities import RunTag

        current = self._store.get_run(run_id).data.tags.get(LOGGED_ARTIFACTS)
        try:
            value = listed_tables(current, paths, TAG_CHARS)
        except ValueError:
            log.warning(
                "tracker.tables_unlisted",
                tracker=self.name,
                mlflow_run=run_id,
                detail=f"the run's {LOGGED_ARTIFACTS} tag is not a JSON list: left as it is, so MLflow "
                "shows the sample tables as JSON files",
            )
            return
        if value is not None:
            self._store.set_tag(run_id, RunTag(LOGGED_ARTIFACTS, value))

    def _forget_runs(self, chunk: list[_Entry], error: Exception) -> None:
        if isinstance(error, SinkUnavailable):
            # The run may have gone (deleted while we were away): found or made again next time.
            for entry in chunk:
                self._runs.pop(entry.message.run, None)

    def _artifact_location(self, run_id: str) -> tuple[bool, str]:
        """(proxied, where): the HTTP URL of the run's artifacts where the tracking server proxies them
        (``mlflow-artifacts:/...``, ``mlflow server``'s default), else the run's artifact URI."""
        if run_id not in self._artifact_roots:
            uri = str(self._store.get_run(run_id).info.artifact_uri)
            if uri.startswith("mlflow-artifacts:") and self._uri.startswith(("http://", "https://")):
                from mlflow.store.artifact.mlflow_artifacts_repo import MlflowArtifactsRepository

                location = (True, str(MlflowArtifactsRepository.resolve_uri(uri, self._uri)))  # type: ignore[no-untyped-call]
            else:
                # An http(s) artifact store is put to like the proxy: with the sink's credentials.
                location = (uri.startswith(("http://", "https://")), uri)
            self._artifact_roots[run_id] = location
        return self._artifact_roots[run_id]
