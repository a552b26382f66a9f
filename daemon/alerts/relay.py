"""The relay: sends the outbox to every webhook endpoint until each message is delivered.

One asyncio task per endpoint, in a thread of its own, so an endpoint that hangs or is down delays only its
own messages. A request is cut off after ``timeout_secs`` in all (``connect_timeout_secs`` to connect). A
2xx answer delivers; 410 Gone disables the endpoint (its pending messages too) with an error log; anything
else, or no answer, is retried after an exponential backoff with jitter (``Retry-After`` honoured), for as
long as it takes: no alert is dropped because its receiver was down. A run's messages reach an endpoint in
the order they were queued. Every attempt is kept (``alert_deliveries``). Of an answer only the status, the
headers and the first :data:`MAX_ANSWER_BYTES` of the body are read: a receiver that answers with 1 GB
costs the daemon 64 KiB, not 1 GB.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import httpx
import structlog

from daemon.alerts.payload import AlertMessage, render
from daemon.alerts.signing import ID_HEADER, TIMESTAMP_HEADER, Secret, load_secret, sign
from daemon.config import Config, WebhookConfig
from daemon.outage import Outage
from storage import alerting
from storage.database import Database
from storage.errors import DatabaseUnreachable
from storage.models import utcnow

if TYPE_CHECKING:
    from daemon.trackers.relay import TrackerRelay

log = structlog.get_logger("daemon.alerts.relay")

#: Seconds between looks at the outbox when nothing wakes the relay (another daemon may have queued).
POLL_SECS = 1.0
#: A Retry-After longer than this is not waited for in full: the message is tried again then.
MAX_RETRY_AFTER_SECS = 3600.0
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


@dataclass(frozen=True)
class Answer:
    """What a receiver answered, as far as the relay reads it."""

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


@dataclass(frozen=True)
class Endpoint:
    config: WebhookConfig
    #: ``None``: requests go unsigned (a Slack incoming webhook checks none).
    secret: Secret | None

    @property
    def name(self) -> str:
        return self.config.name


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


def trackers(database: Database, config: Config, environ: Mapping[str, str]) -> TrackerRelay | None:
    """``[[trackers]]``' relay threads (None without trackers); the libraries load in their threads."""
    if not config.trackers:
        return None
    from daemon.trackers.relay import TrackerRelay

    return TrackerRelay(database, config.trackers, environ)


def backoff(attempts: int, cap: float, rng: random.Random) -> float:
    """Seconds before the next try after ``attempts`` failed ones: 1, 2, 4, ... up to ``cap``, each between
    half and all of it (jitter, so that endpoints recovering together are not hit in lockstep)."""
    # The exponent capped: after a week of outage 2 ** attempts would overflow a float.
    return min(cap, 2.0 ** min(max(0, attempts - 1), 60)) * rng.uniform(0.5, 1.0)


def retry_after(value: str | None, now: datetime) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if re.fullmatch(r"[0-9]{1,9}", value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


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


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    disabled: bool = False


class Relay:
    def __init__(
        self,
        database: Database,
        targets: Sequence[Endpoint],
        *,
        rng: random.Random | None = None,
        outage: Outage | None = None,
        trackers: TrackerRelay | None = None,
    ) -> None:
        self._db = database
        #: ``[[trackers]]``' threads, started, woken and stopped with this relay.
        self._trackers = trackers
        #: Shared with the main loop: an outage is logged once, not once per pass of each thread.
        self._outage = outage
        self._targets = list(targets)
        self._rng = rng or random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._started = threading.Event()

    def start(self) -> Relay:
        # Only a reminder: with the database away it is skipped, and the relay starts all the same.
        with contextlib.suppress(DatabaseUnreachable), self._db.session() as session:
            for target in self._targets:
                # 410 Gone stands across restarts: `evald webhook test NAME` answered 2xx enables it again.
                reason = alerting.disabled(session, target.name)
                if reason is not None:
                    log.error("webhook.still_disabled", endpoint=target.name, reason=reason)
        self._thread = threading.Thread(target=self._run, name="evald-relay", daemon=True)
        self._thread.start()
        self._started.wait(10)
        if self._trackers is not None:
            self._trackers.start()
        return self

    def wake(self) -> None:
        """Look at the outbox now (a result's alerts were just committed)."""
        if self._trackers is not None:
            self._trackers.wake()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            for event in self._events.values():
                loop.call_soon_threadsafe(event.set)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._trackers is not None:
            self._trackers.stop(timeout)

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._events = {target.name: asyncio.Event() for target in self._targets}
        self._started.set()
        await asyncio.gather(*(self._serve(target) for target in self._targets))

    async def _serve(self, target: Endpoint) -> None:
        timeout = httpx.Timeout(target.config.timeout_secs, connect=target.config.connect_timeout_secs)
        # One message claimed at a time, for as long as sending it may take: a relay killed mid-send
        # leaves it to the next start after at most this.
        lease = timedelta(seconds=target.config.timeout_secs + CLAIM_MARGIN_SECS)
        event = self._events[target.name]
        async with httpx.AsyncClient(timeout=timeout, headers=CLIENT_HEADERS) as client:
            while not self._stopping:
                event.clear()
                try:
                    with self._db.session() as session:
                        claimed = alerting.due(
                            session, endpoint=target.name, now=utcnow(), lease=lease, limit=1
                        )
                    if claimed:
                        await self._send(client, target, claimed[0])
                        continue
                    with self._db.session() as session:
                        later = alerting.next_due_at(session, endpoint=target.name)
                except DatabaseUnreachable as exc:
                    # The outbox waits for the database. The outage is logged once, by whoever sees it
                    # first; the daemon's main loop says when it is over.
                    if self._outage is None:
                        log.warning("relay.db_unavailable", endpoint=target.name, error=str(exc))
                    else:
                        self._outage.failed(exc, where=f"relay:{target.name}")
                    later = utcnow() + timedelta(seconds=POLL_SECS)
                except Exception as exc:
                    # The database away for a moment must not end the relay: the outbox waits for it.
                    log.exception("relay.failed", endpoint=target.name, error=repr(exc))
                    later = utcnow() + timedelta(seconds=POLL_SECS)
                wait = POLL_SECS
                if later is not None:
                    wait = min(wait, max(0.0, (later - utcnow()).total_seconds()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=max(wait, 0.01))

    async def _send(self, client: httpx.AsyncClient, target: Endpoint, due: alerting.Due) -> Outcome:
        try:
            body = render(target.config.format, message(due.event_id, due.body))
        except (ValueError, KeyError, TypeError) as exc:
            with self._db.session() as session:
                alerting.give_up(session, due.id, f"cannot be rendered: {exc}")
            log.error("webhook.unrenderable", endpoint=target.name, event_id=due.event_id, error=str(exc))
            return Outcome(delivered=False)
        headers = request_headers(target, due.event_id, body)
        started_at = utcnow()
        started = time.perf_counter()
        status: int | None = None
        error: str | None = None
        wait_hint: str | None = None
        said = ""
        try:
            # The whole request, however slowly a receiver drips its answer (httpx times each read).
            answer = await asyncio.wait_for(
                post(client, target.config.url, body, headers), timeout=target.config.timeout_secs
            )
            status = answer.status
            wait_hint = answer.headers.get("retry-after")
            said = " ".join(answer.text.split())[:200]
        except TimeoutError:
            error = f"no answer within {target.config.timeout_secs:g} s"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        duration = time.perf_counter() - started
        hinted = retry_after(wait_hint, utcnow()) if status is not None and not 200 <= status < 300 else None
        with self._db.session() as session:
            attempts = alerting.record_attempt(
                session,
                due.id,
                alerting.Attempt(started_at, duration, status, error, hinted),
            )
            if status is not None and 200 <= status < 300:
                alerting.delivered(session, due.id)
                log.info("webhook.delivered", endpoint=target.name, event_id=due.event_id, attempts=attempts)
                return Outcome(delivered=True)
            if status == 410:
                count = alerting.disable_endpoint(
                    session, target.name, f"answered 410 Gone to {due.event_id}"
                )
                log.error(
                    "webhook.disabled",
                    endpoint=target.name,
                    reason="410 Gone",
                    pending_dropped=count,
                )
                return Outcome(delivered=False, disabled=True)
            refused = status is not None and 400 <= status < 500 and status not in RETRYABLE_4XX
            if refused and attempts >= PERMANENT_AFTER:
                alerting.give_up(session, due.id, f"HTTP {status} {attempts} times")
                log.error(
                    "webhook.refused",
                    endpoint=target.name,
                    event_id=due.event_id,
                    status=status,
                    attempts=attempts,
                    answer=said,
                )
                return Outcome(delivered=False)
            delay = backoff(attempts, target.config.max_backoff_secs, self._rng)
            if hinted is not None:
                delay = max(delay, min(hinted, MAX_RETRY_AFTER_SECS))
            why = error or f"HTTP {status}"
            alerting.retry_at(session, due.id, utcnow() + timedelta(seconds=delay), why)
        log.warning(
            "webhook.retry",
            endpoint=target.name,
            event_id=due.event_id,
            attempts=attempts,
            error=why,
            retry_in_s=round(delay, 3),
            answer=said,
        )
        return Outcome(delivered=False)


__all__ = ["Endpoint", "Relay", "backoff", "endpoints", "message", "retry_after", "send_test", "trackers"]
