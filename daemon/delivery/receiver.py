"""A real webhook receiver on loopback, for tests and the demo: it verifies every request's Standard
Webhooks signature, drops retried duplicates by ``webhook-id``, and records what came in order.

It can be told how to answer the next requests (a status such as 500 or 410, a ``Retry-After``, a delay
before answering) to exercise a sender's retries, backoff and timeouts::

    with WebhookReceiver(secret) as receiver:
        receiver.respond(503, retry_after="2")
        ...  # the relay POSTs to receiver.url
        [delivery] = receiver.wait_for(1)
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from daemon.config import Secret
from daemon.delivery.errors import SignatureInvalid
from daemon.delivery.signing import DEFAULT_TOLERANCE_S, ID_HEADER, verify


@dataclass(frozen=True)
class Attempt:
    """One request as the receiver saw and answered it."""

    webhook_id: str | None
    path: str
    headers: Mapping[str, str]
    body: bytes
    #: ``time.monotonic()`` on arrival, to measure a sender's backoff between attempts.
    received_at: float
    status: int
    #: Why verification failed; ``None`` for a verified request.
    error: str | None
    #: A verified request whose id had been accepted before (answered 200, not delivered again).
    duplicate: bool
    #: Seconds the receiver held the request before answering (``hang``): a sender with a shorter
    #: timeout never saw this answer, so its re-send of the same id is expected.
    delay_s: float = 0.0


@dataclass(frozen=True)
class _Reply:
    status: int
    retry_after: str | None
    delay_s: float


class WebhookReceiver:
    """Listens on ``127.0.0.1`` (a free port) once started; :attr:`url` is where to POST."""

    def __init__(
        self,
        secret: Secret,
        *,
        tolerance_s: int = DEFAULT_TOLERANCE_S,
        clock: Callable[[], float] = time.time,
        port: int = 0,
    ) -> None:
        self._secret = secret
        #: 0: a free port; a given one lets a test bring a receiver back where a sender expects it.
        self._port = port
        self._tolerance_s = tolerance_s
        self._clock = clock
        self._changed = threading.Condition()
        self._attempts: list[Attempt] = []
        self._accepted_ids: set[str] = set()
        self._script: deque[_Reply] = deque()
        # Set on close, so handlers told to hang stop waiting instead of outliving the receiver.
        self._closing = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the webhook receiver is not started; use it as a context manager")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def start(self) -> WebhookReceiver:
        if self._server is not None:
            raise RuntimeError("the webhook receiver is already started")
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), _handler_class(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-receiver", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def respond(
        self, status: int, *, retry_after: str | None = None, delay_s: float = 0.0, times: int = 1
    ) -> None:
        """Answer the next ``times`` verified requests with ``status`` (after ``delay_s`` seconds). Only a
        2xx answer counts as delivered; requests beyond the script are answered 200."""
        if not 200 <= status <= 599:
            raise ValueError(f"an HTTP status is 200 to 599, not {status}")
        if delay_s < 0 or times < 1:
            raise ValueError(f"delay_s is 0 or more and times 1 or more, not {delay_s} and {times}")
        with self._changed:
            self._script.extend([_Reply(status, retry_after, delay_s)] * times)

    def hang(self, seconds: float, *, times: int = 1) -> None:
        """Hold the next ``times`` verified requests for ``seconds`` before accepting them, so a sender
        with a shorter timeout gives up and retries (and its retry is a duplicate)."""
        self.respond(HTTPStatus.OK, delay_s=seconds, times=times)

    @property
    def attempts(self) -> list[Attempt]:
        """Every request with a ``Content-Length`` (others are answered 411 unread), in arrival order."""
        with self._changed:
            return list(self._attempts)

    @property
    def deliveries(self) -> list[Attempt]:
        """Verified requests answered 2xx, each ``webhook-id`` once, in arrival order."""
        with self._changed:
            return self._deliveries()

    def _deliveries(self) -> list[Attempt]:
        return [a for a in self._attempts if a.error is None and a.status < 300 and not a.duplicate]

    def wait_for(self, count: int, *, timeout: float = 10.0) -> list[Attempt]:
        """The deliveries once there are at least ``count``; raises ``TimeoutError`` after ``timeout``."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._deliveries()) >= count, timeout):
                raise TimeoutError(
                    f"the webhook receiver got {len(self._deliveries())} of {count} deliveries in {timeout}s "
                    f"({len(self._attempts)} requests)"
                )
            return self._deliveries()

    def _handle(self, path: str, headers: Mapping[str, str], body: bytes) -> _Reply:
        """Verifies the request, picks its answer and records it (after the delay, if told to hang)."""
        received_at = time.monotonic()
        webhook_id = headers.get(ID_HEADER)
        try:
            verify(self._secret, headers, body, now=self._clock(), tolerance_s=self._tolerance_s)
        except SignatureInvalid as exc:
            error: str | None = str(exc)
        else:
            error = None
        with self._changed:
            if error is not None:
                reply = _Reply(HTTPStatus.UNAUTHORIZED, None, 0.0)
            elif self._script:
                reply = self._script.popleft()
            else:
                reply = _Reply(HTTPStatus.OK, None, 0.0)
            accepted = error is None and reply.status < 300
            # A retry of an accepted request is acknowledged, as the spec asks, but not delivered twice.
            duplicate = accepted and webhook_id in self._accepted_ids
            if accepted and webhook_id is not None:
                self._accepted_ids.add(webhook_id)
            attempt = Attempt(
                webhook_id, path, headers, body, received_at, reply.status, error, duplicate, reply.delay_s
            )
            if not reply.delay_s:
                self._record(attempt)
        if reply.delay_s:
            self._closing.wait(reply.delay_s)
            with self._changed:
                self._record(attempt)
        return reply

    def _record(self, attempt: Attempt) -> None:
        self._attempts.append(attempt)
        self._changed.notify_all()


def _handler_class(receiver: WebhookReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self._answer(HTTPStatus.LENGTH_REQUIRED, None)
                return
            body = self.rfile.read(int(length))
            headers = {name.lower(): value for name, value in self.headers.items()}
            reply = receiver._handle(self.path, headers, body)
            self._answer(reply.status, reply.retry_after)

        def _answer(self, status: int, retry_after: str | None) -> None:
            try:
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the sender gave up waiting (a hang longer than its timeout): what the test wants

        def log_message(self, format: str, *args: object) -> None:
            pass  # the attempts list is the record; stderr lines would only clutter test output

    return Handler
