"""The webhook sink: an alert POSTed to one endpoint, signed (Standard Webhooks), until it answers 2xx.

One message at a time per endpoint, a run's in the order queued (the route claims one, and the next only
once the one before is settled). A request is cut off after ``timeout_secs`` in all
(``connect_timeout_secs`` to connect). A 2xx answer delivers; 410 Gone disables the endpoint (its pending
messages too) with an error log; a 4xx other than 408, 425 and 429 :data:`PERMANENT_AFTER` times gives the
message up; anything else, or no answer, is retried after an exponential backoff with jitter
(``Retry-After`` honoured), for as long as it takes: no alert is dropped because its receiver was down. Of
an answer only the status, the headers and the first :data:`MAX_ANSWER_BYTES` of the body are read: a
receiver that answers with 1 GB costs the daemon 64 KiB, not 1 GB. ``evald webhook test`` sends with
:func:`send_test`, here too.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import httpx
import structlog

from daemon.config import Config, Secret, WebhookConfig, load_secret
from daemon.delivery.backoff import retry_after
from daemon.delivery.base import Batch, Route, Sink, Voice
from daemon.delivery.errors import SinkError, SinkGone, SinkRejected, SinkUnavailable
from daemon.delivery.payload import AlertMessage, render
from daemon.delivery.signing import ID_HEADER, TIMESTAMP_HEADER, sign
from daemon.outage import Outage
from storage.models import utcnow
from storage.outbox import Due

log = structlog.get_logger("daemon.delivery.sinks.webhook")

#: A claimed message is another relay's to send again this long after its request's own timeout.
CLAIM_MARGIN_SECS = 5.0
#: A 4xx other than 408 and 429 this many times: the endpoint refuses the message for good, and it stops
#: blocking the run's later alerts.
PERMANENT_AFTER = 5
RETRYABLE_4XX = frozenset({408, 425, 429})
#: What is read of an answer's body: enough for a receiver's error text. The rest is never read.
MAX_ANSWER_BYTES = 64 * 1024
#: Every request's own headers; ``identity`` so that the bytes read are the text itself: a compressed
#: answer would be inflated chunk by chunk, and a small gzip chunk may inflate a thousandfold.
CLIENT_HEADERS = {"user-agent": "evald", "accept-encoding": "identity"}

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """What a receiver answered, as far as the sink reads it."""

    status: int
    headers: httpx.Headers
    #: The start of the body, at most :data:`MAX_ANSWER_BYTES`.
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _kept(chunks: list[bytes], chunk: bytes, size: int) -> int:
    """Add ``chunk`` to ``chunks`` up to :data:`MAX_ANSWER_BYTES` in all; the new size."""
    room = MAX_ANSWER_BYTES - size
    chunks.append(chunk[:room])
    return size + min(len(chunk), room)


async def post(client: httpx.AsyncClient, url: str, content: bytes, headers: Mapping[str, str]) -> Answer:
    """POST ``content`` and read the answer's start; the connection is closed on the rest, unread."""
    chunks: list[bytes] = []
    size = 0
    async with client.stream("POST", url, content=content, headers=headers) as response:
        async for chunk in response.aiter_raw():
            size = _kept(chunks, chunk, size)
            if size >= MAX_ANSWER_BYTES:
                break
    return Answer(response.status_code, response.headers, b"".join(chunks))


def post_now(client: httpx.Client, url: str, content: bytes, headers: Mapping[str, str]) -> Answer:
    """:func:`post` for a blocking client (``evald webhook test``)."""
    chunks: list[bytes] = []
    size = 0
    with client.stream("POST", url, content=content, headers=headers) as response:
        for chunk in response.iter_raw():
            size = _kept(chunks, chunk, size)
            if size >= MAX_ANSWER_BYTES:
                break
    return Answer(response.status_code, response.headers, b"".join(chunks))


def message(event_id: str, body: str) -> AlertMessage:
    """The stored event as the payload renderer takes it."""
    facts: dict[str, Any] = json.loads(body)
    for name in ("value", "baseline"):
        if isinstance(facts.get(name), str):
            facts[name] = float(facts[name])
    ends_at = facts.pop("ends_at")
    return AlertMessage(
        id=event_id,
        starts_at=datetime.fromisoformat(facts.pop("starts_at")),
        ends_at=None if ends_at is None else datetime.fromisoformat(ends_at),
        **facts,
    )


class WebhookVoice(Voice[bytes]):
    def unreadable(self, route: Route[bytes], due: Due, error: Exception, why: str) -> None:
        log.error("webhook.unrenderable", endpoint=route.name, event_id=due.event_id, error=str(error))

    def delivered(
        self,
        route: Route[bytes],
        done: Sequence[tuple[Due, bytes]],
        *,
        fresh: int,
        attempts: int,
        seconds: float,
    ) -> None:
        for due, _ in done:
            log.info("webhook.delivered", endpoint=route.name, event_id=due.event_id, attempts=attempts)

    def retry(
        self, route: Route[bytes], left: Sequence[Due], error: SinkError, *, attempts: int, delay: float
    ) -> None:
        log.warning(
            "webhook.retry",
            endpoint=route.name,
            event_id=left[0].event_id,
            attempts=attempts,
            error=str(error),
            retry_in_s=round(delay, 3),
            answer=error.answer,
        )

    def gave_up(self, route: Route[bytes], due: Due, error: SinkRejected, *, attempts: int) -> None:
        log.error(
            "webhook.refused",
            endpoint=route.name,
            event_id=due.event_id,
            status=error.status,
            attempts=attempts,
            answer=error.answer,
        )

    def disabled(self, route: Route[bytes], error: SinkError, *, dropped: int) -> None:
        log.error("webhook.disabled", endpoint=route.name, reason="410 Gone", pending_dropped=dropped)

    def still_disabled(self, route: Route[bytes], reason: str) -> None:
        log.error("webhook.still_disabled", endpoint=route.name, reason=reason)

    def db_unavailable(self, route: Route[bytes], error: Exception, outage: Outage | None) -> None:
        # The outage is logged once, by whoever sees it first; the daemon's main loop says when it is over.
        if outage is None:
            log.warning("relay.db_unavailable", endpoint=route.name, error=str(error))
        else:
            outage.failed(error, where=f"relay:{route.name}")

    def failed(self, route: Route[bytes], error: Exception) -> None:
        log.exception("relay.failed", endpoint=route.name, error=repr(error))


VOICE = WebhookVoice()


class Endpoint(Route[bytes]):
    """A ``[[webhooks]]`` endpoint's route: one message in flight per run, rendered in its format."""

    one_per_run = True
    unreadable = "cannot be rendered"

    def __init__(self, config: WebhookConfig, secret: Secret | None) -> None:
        super().__init__(
            name=config.name, endpoint=config.name, voice=VOICE, max_backoff_secs=config.max_backoff_secs
        )
        self.config = config
        #: ``None``: requests go unsigned (a Slack incoming webhook checks none).
        self.secret = secret

    @property
    def lease(self) -> timedelta:
        # One message claimed at a time, for as long as sending it may take.
        return timedelta(seconds=self.config.timeout_secs + CLAIM_MARGIN_SECS)

    def read(self, event_id: str, body: str) -> bytes:
        return render(self.config.format, message(event_id, body))

    def open(self) -> WebhookSink:
        return WebhookSink(self)


def endpoints(config: Config, environ: Mapping[str, str]) -> list[Endpoint]:
    """The configured endpoints with their secrets loaded (a missing secret stops the start: SecretError)."""
    found = []
    for webhook in config.webhooks:
        signed = webhook.secret_env is not None or webhook.secret_file is not None
        secret = (
            load_secret(env=webhook.secret_env, file=webhook.secret_file, environ=environ) if signed else None
        )
        found.append(Endpoint(webhook, secret))
    return found


def request_headers(target: Endpoint, event_id: str, body: bytes) -> dict[str, str]:
    """Standard Webhooks headers, signed when the endpoint has a secret; signed now, not when queued, so a
    retry hours later is not refused as stale."""
    stamp = int(time.time())
    headers = (
        sign(target.secret, event_id, stamp, body)
        if target.secret is not None
        else {ID_HEADER: event_id, TIMESTAMP_HEADER: str(stamp)}
    )
    headers["content-type"] = "application/json"
    return headers


class WebhookSink(Sink[bytes]):
    """POSTs to one endpoint from its lane's thread, on an event loop of its own: the whole request is cut
    off at ``timeout_secs``, however slowly a receiver drips its answer (httpx times each read)."""

    def __init__(self, target: Endpoint) -> None:
        self.name = target.name
        self._target = target
        self._loop = asyncio.new_event_loop()
        config = target.config
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout_secs, connect=config.connect_timeout_secs),
            headers=CLIENT_HEADERS,
        )

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(work)

    def deliver_many(self, items: Sequence[tuple[str, bytes]]) -> Batch:
        status: int | None = None
        for done, (event_id, body) in enumerate(items):
            try:
                status = self._deliver(event_id, body)
            except SinkError as exc:
                return Batch((True,) * done, exc, status)
        return Batch((True,) * len(items), None, status)

    def _deliver(self, event_id: str, body: bytes) -> int:
        """The 2xx status the endpoint answered; otherwise the error that says what comes next."""
        config = self._target.config
        headers = request_headers(self._target, event_id, body)
        try:
            answer = self._run(
                asyncio.wait_for(post(self._client, config.url, body, headers), timeout=config.timeout_secs)
            )
        except TimeoutError:
            raise SinkUnavailable(f"no answer within {config.timeout_secs:g} s") from None
        except httpx.HTTPError as exc:
            raise SinkUnavailable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc
        status = answer.status
        if 200 <= status < 300:
            return status
        hinted = retry_after(answer.headers.get("retry-after"), utcnow())
        said = " ".join(answer.text.split())[:200]
        if status == 410:
            raise SinkGone(f"answered 410 Gone to {event_id}", status=status, retry_after=hinted, answer=said)
        if 400 <= status < 500 and status not in RETRYABLE_4XX:
            raise SinkRejected(
                f"HTTP {status}", after=PERMANENT_AFTER, status=status, retry_after=hinted, answer=said
            )
        raise SinkUnavailable(f"HTTP {status}", status=status, retry_after=hinted, answer=said)

    def where(self, run: str) -> str:
        # Not the URL: an incoming webhook's URL is its secret.
        return f"webhook {self.name}"

    def close(self) -> None:
        try:
            self._run(self._client.aclose())
        finally:
            self._loop.close()


def test_message(target: Endpoint, links: Mapping[str, str]) -> AlertMessage:
    """What ``evald webhook test`` sends: an info-level alert that names itself a test."""
    now = utcnow()
    return AlertMessage(
        id=f"evald_test_{uuid.uuid4().hex}",
        fingerprint="evald-webhook-test",
        run="evald-webhook-test",
        checkpoint=None,
        step=None,
        task=None,
        metric=None,
        rule="webhook_test",
        value=None,
        baseline=None,
        best_step=None,
        rollback_step=None,
        severity="info",
        state="firing",
        message=f"A test of webhook {target.name!r} from evald: nothing is wrong.",
        links=links,
        starts_at=now,
        ends_at=None,
    )


@dataclass(frozen=True)
class TestResult:
    event_id: str
    status: int | None
    #: The start of the answer's body, or what went wrong.
    detail: str
    duration_s: float


def send_test(target: Endpoint, links: Mapping[str, str]) -> TestResult:
    """POST a signed test alert to ``target`` now, with its timeouts; nothing is stored or queued."""
    test = test_message(target, links)
    body = render(target.config.format, test)
    timeout = httpx.Timeout(target.config.timeout_secs, connect=target.config.connect_timeout_secs)
    started = time.perf_counter()
    try:
        with httpx.Client(timeout=timeout, headers=CLIENT_HEADERS) as client:
            answer = post_now(client, target.config.url, body, request_headers(target, test.id, body))
    except httpx.HTTPError as exc:
        return TestResult(test.id, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
    return TestResult(test.id, answer.status, answer.text[:500], time.perf_counter() - started)


__all__ = ["Endpoint", "WebhookSink", "endpoints", "message", "send_test"]
