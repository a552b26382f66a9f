"""The daemon's one way to a Ray cluster: its Jobs API (``ray.job_submission``), over HTTP, with a timeout
on every request and Ray's errors sorted into what the executor acts on.

The daemon never joins the cluster (no ``ray.init`` here): the Jobs API is how jobs reach a cluster from
outside (KubeRay's RayJob uses it too), a client needs no matching Python, and a head that restarts
costs the daemon nothing but unanswered requests. The configured address may be ``auto``, a Ray Client
``ray://`` address or the GCS's ``host:port``: Ray resolves each to the dashboard's URL, once, and again
after the head was away (it may come back elsewhere). ``ray`` is imported here only: evald runs without
it unless ``kind = "ray"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from daemon.errors import EvaldError

#: Seconds one request to the dashboard may take before the head counts as away.
REQUEST_TIMEOUT_S = 15.0

_STATUS = re.compile(r"status code (\d+)")


class RayUnreachable(EvaldError):
    """The cluster does not answer (head down, restarting, or the address resolves to nothing)."""


class RayRefused(EvaldError):
    """The Jobs API refused a request (a bad runtime_env, a duplicate submission id): the message is Ray's."""


class JobExists(RayRefused):
    """A job with this submission id exists already."""


@dataclass(frozen=True)
class RayJob:
    """What the Jobs API says of one job (times in seconds since the epoch)."""

    submission_id: str
    status: str
    message: str
    error_type: str | None
    metadata: Mapping[str, str]
    start_time: float | None
    end_time: float | None
    driver_exit_code: int | None

    @property
    def finished(self) -> bool:
        return self.status in ("SUCCEEDED", "FAILED", "STOPPED")


def ray_installed() -> bool:
    try:
        import ray.job_submission  # noqa: F401
    except ImportError:
        return False
    return True


def _job(details: Any) -> RayJob:
    def seconds(ms: int | None) -> float | None:
        return None if not ms else ms / 1000.0

    status = getattr(details.status, "value", details.status)
    return RayJob(
        submission_id=str(details.submission_id or details.job_id),
        status=str(status),
        message=str(details.message or ""),
        error_type=None if details.error_type is None else str(details.error_type),
        metadata=dict(details.metadata or {}),
        start_time=seconds(details.start_time),
        end_time=seconds(details.end_time),
        driver_exit_code=getattr(details, "driver_exit_code", None),
    )


def _status(exc: BaseException) -> int | None:
    match = _STATUS.search(str(exc))
    return int(match.group(1)) if match else None


class RayJobs:
    """The Jobs API of the cluster at ``address`` (see the module's docstring)."""

    def __init__(self, address: str, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.address = address
        self._timeout = timeout_s
        self._client: Any = None

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's URL once resolved (None before the first answer)."""
        return None if self._client is None else str(self._client.get_address())

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        try:
            import requests
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise RayRefused("the ray package is not installed: pip install 'evald[ray]'") from exc
        timeout = self._timeout

        class _Client(JobSubmissionClient):
            # Ray's client waits for an answer forever: a head that hangs would hang the daemon.
            def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
                kwargs.setdefault("timeout", timeout)
                return super()._do_request(method, endpoint, **kwargs)

        try:
            self._client = _Client(self.address)
        except (ConnectionError, requests.exceptions.RequestException) as exc:
            raise RayUnreachable(f"Ray at {self.address} does not answer: {_first(exc)}") from exc
        except (RuntimeError, ValueError) as exc:
            # `auto` with no Ray node here, a GCS without a dashboard, a version too old.
            raise RayUnreachable(f"Ray at {self.address}: {_first(exc)}") from exc
        return self._client

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        import requests

        client = self._connect()
        try:
            return getattr(client, call)(*args, **kwargs)
        except (ConnectionError, requests.exceptions.RequestException) as exc:
            # Resolved again next time: a head that restarts may come back at another address.
            self._client = None
            raise RayUnreachable(
                f"Ray's dashboard at {self.address} does not answer ({what}): {_first(exc)}"
            ) from exc
        except RuntimeError as exc:
            code = _status(exc)
            if code is not None and code >= 500 and "already exists" not in str(exc):
                raise RayUnreachable(f"Ray's dashboard failed to answer ({what}): {_first(exc)}") from exc
            if "already exists" in str(exc):
                raise JobExists(_first(exc)) from exc
            raise RayRefused(_first(exc)) from exc

    def version(self) -> str:
        """The cluster's Ray version (asking it proves the Jobs API answers)."""
        client = self._connect()
        self._call("version", "get_version")
        return str(getattr(client, "_server_ray_version", "") or "")

    def submit(
        self,
        *,
        submission_id: str,
        entrypoint: str,
        runtime_env: Mapping[str, Any],
        metadata: Mapping[str, str],
    ) -> str:
        # The driver only waits on its ranks: it reserves nothing itself, so it never queues behind them.
        return str(
            self._call(
                "submit",
                "submit_job",
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=dict(runtime_env),
                metadata=dict(metadata),
                entrypoint_num_cpus=0,
            )
        )

    def info(self, submission_id: str) -> RayJob | None:
        """The job, or None when the cluster does not know it (never did, or forgot it at a restart)."""
        try:
            return _job(self._call("job info", "get_job_info", submission_id))
        except RayRefused as exc:
            if "does not exist" in str(exc) or _status(exc) == 404:
                return None
            raise

    def jobs(self) -> list[RayJob]:
        return [_job(d) for d in self._call("list jobs", "list_jobs")]

    def stop(self, submission_id: str) -> bool:
        try:
            return bool(self._call("stop", "stop_job", submission_id))
        except RayRefused as exc:
            if "does not exist" in str(exc):
                return False
            raise

    def delete(self, submission_id: str) -> None:
        self._call("delete", "delete_job", submission_id)

    def logs(self, submission_id: str) -> str:
        try:
            return str(self._call("logs", "get_job_logs", submission_id))
        except RayRefused:
            return ""


def _first(exc: BaseException) -> str:
    """The line of Ray's error that says what happened (its messages carry whole tracebacks)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception):", line):
            return line[:400]
    return (lines[0] if lines else type(exc).__name__)[:400]
