"""What the daemon reads of an HTTP answer is bounded (issue 31): a webhook receiver that answers with a
1 GB body (generated as it is sent, on loopback) costs the relay its first 64 KiB, not 1 GB of memory,
and the delivery is judged by the status as before: a 500 retried, a 200 delivered (SQLite and
PostgreSQL)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil

from daemon.alerts.lifecycle import Alerter
from daemon.config import Config
from daemon.delivery.relay import Relay
from daemon.delivery.sinks.webhook import Endpoint, send_test
from storage.database import Database
from tests.deadlines import Deadline
from tests.test_alerts import SECRET, fire_cliffs, history, outbox, relay_config

__all__ = ["relay_config"]  # a fixture, used by name

HUGE = 1024**3
CHUNK = b"x" * (1024 * 1024)
#: The relay's own growth while it is answered 1 GB: reading the answer whole cost 3.3 GB.
RSS_BOUND = 200 * 1024 * 1024
#: A request timeout long enough to read 1 GB over loopback, so only reading less keeps this short.
TIMEOUT_SECS = 60.0


class HugeAnswers:
    """A loopback HTTP server answering every POST with the next scripted status (then 200) and a body of
    :data:`HUGE` bytes, written chunk by chunk until the sender hangs up."""

    def __init__(self, port: int, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.answered: list[int] = []
        #: Bytes of body written per request before the sender closed the connection.
        self.sent: list[int] = []
        self._lock = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer._lock:
                    status = outer.statuses.pop(0) if outer.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", str(HUGE))
                self.send_header("Retry-After", "0")
                self.end_headers()
                sent = 0
                try:
                    while sent < HUGE:
                        self.wfile.write(CHUNK)
                        sent += len(CHUNK)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the sender read what it wanted and hung up: the point of the test
                self.close_connection = True
                with outer._lock:
                    outer.answered.append(status)
                    outer.sent.append(sent)
                    outer._lock.notify_all()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def __enter__(self) -> HugeAnswers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def wait_answered(self, count: int, timeout: float) -> list[int]:
        with self._lock:
            assert self._lock.wait_for(lambda: len(self.answered) >= count, timeout), self.answered
            return list(self.answered)


@contextmanager
def peak_rss_growth() -> Iterator[list[int]]:
    """This process's highest RSS above where it started, sampled every 5 ms (the last item, once done):
    a body read whole and freed again would not show in a reading taken after."""
    process = psutil.Process()
    start = process.memory_info().rss
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    growth: list[int] = []
    try:
        yield growth
    finally:
        done.set()
        sampler.join()
        growth.append(max(peak[0], process.memory_info().rss) - start)


def test_a_1gb_answer_is_not_read_and_the_status_still_decides(
    database: Database, relay_config: tuple[Config, int]
) -> None:
    config, port = relay_config
    hook = config.webhooks[0].model_copy(update={"timeout_secs": TIMEOUT_SECS})
    with HugeAnswers(port, [500]) as receiver, peak_rss_growth() as growth:
        bound = Deadline(20)
        relay = Relay(database, [Endpoint(hook, SECRET)]).start()
        try:
            fire_cliffs(database, config, Alerter(config, wake=relay.wake), 1)
            queued = len(outbox(database))
            # The 500 retried, then every message delivered, each answered with 1 GB.
            receiver.wait_answered(queued + 1, timeout=30)
            deadline = Deadline(10)
            while not deadline.expired() and {row[1] for row in outbox(database)} != {"delivered"}:
                time.sleep(0.05)
        finally:
            relay.stop()
        late, took = bound.expired(), bound.waited()
    assert {row[1] for row in outbox(database)} == {"delivered"}
    assert [code for code, _ in history(database)] == [500] + [200] * queued
    assert growth[0] < RSS_BOUND, f"RSS grew {growth[0] / 2**20:.0f} MiB"
    # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
    assert not late, f"took {took:.1f} s"
    # The sender hung up long before the end of each body (the kernel's buffers hold a few MB).
    assert max(receiver.sent) < HUGE // 4, receiver.sent


def test_evald_webhook_test_reads_the_start_of_a_1gb_answer(
    database: Database, relay_config: tuple[Config, int]
) -> None:
    config, port = relay_config
    hook = config.webhooks[0].model_copy(update={"timeout_secs": TIMEOUT_SECS})
    with HugeAnswers(port, [502]) as receiver, peak_rss_growth() as growth:
        result = send_test(Endpoint(hook, SECRET), {})
        receiver.wait_answered(1, timeout=10)
    assert result.status == 502
    assert result.detail == "x" * 500  # the start of what it said, as `evald webhook test` prints it
    assert result.duration_s < 10, result.duration_s
    assert growth[0] < RSS_BOUND, f"RSS grew {growth[0] / 2**20:.0f} MiB"
