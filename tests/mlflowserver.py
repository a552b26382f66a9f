"""A real MLflow tracking server on loopback for the tracker tests, and a gate in front of it.

The server (``mlflow server``: SQLite backend store, artifacts proxied into a temp folder, a free port) is
started once per test session, shared by every module that binds ``mlflow_server_fixture()`` and by every
xdist worker of the run (it takes 70-120 s to come up on a busy machine): the first user starts it and
writes where it is beside the run's temp folders; the others find it there; the last to finish stops it
(a count kept under a file lock). Tests isolate themselves by experiment name. The
gate is a TCP forwarder on a port of its own: closing it makes the server unreachable for the client
(connection refused, as a server that is down), opening it again on the same port brings it back, without
waiting for the server to restart. The stalling proxy forwards HTTP and holds chosen requests past the
client's timeout, as a server too busy to answer one call in time. Without mlflow installed the tests skip
with a message, unless ``EVALD_REQUIRE_MLFLOW=1`` (CI), where they fail.
"""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deadlines import Deadline
from tests.harness import free_port

#: A cold start (the store's migrations, the server's imports) on two shared cores.
START_TIMEOUT_S = 240.0
#: SIGTERM, then SIGKILL after this long (its uvicorn workers may take 20 s to drain on SIGTERM).
STOP_WAIT_S = 3.0


def require_mlflow() -> None:
    if importlib.util.find_spec("mlflow") is None:
        message = (
            "mlflow is not installed (pip install 'evald[mlflow]'); EVALD_REQUIRE_MLFLOW=1 fails instead"
        )
        if os.environ.get("EVALD_REQUIRE_MLFLOW") == "1":
            pytest.fail(message)
        pytest.skip(message)


@dataclass
class MlflowServer:
    uri: str
    port: int
    folder: Path
    #: The server's process (a process group of its own).
    pid: int
    #: None: started by another process of this test run (the shared server), stopped by its last user.
    process: subprocess.Popen[bytes] | None


def _healthy(uri: str) -> bool:
    try:
        # /health answers without credentials on the basic-auth server too.
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


#: The basic-auth server's admin (``--app-name basic-auth``), who owns every experiment.
ADMIN = ("admin", "evald-admin-Passw0rd")


def start_server(folder: Path, *, auth: bool = False) -> MlflowServer:
    folder.mkdir(parents=True, exist_ok=True)
    # No job runner: MLflow's server otherwise starts one and seven huey consumers for its GenAI jobs,
    # each importing mlflow (33 s of CPU per server on 2 cores), none of which evald's sinks use.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    if auth:
        env |= {"MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN[1], "MLFLOW_FLASK_SERVER_SECRET_KEY": "evald-tests"}
    port = free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    command = [
        str(mlflow) if mlflow.exists() else shutil.which("mlflow") or "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{folder / 'mlflow.db'}",
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        *(("--app-name", "basic-auth") if auth else ()),
    ]
    log = (folder / "server.log").open("wb")
    # A session of its own: the server's workers are ended with it.
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True, env=env
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = Deadline(START_TIMEOUT_S)
    while not _healthy(uri):
        if process.poll() is not None or deadline.expired():
            stop_server(process)
            tail = (folder / "server.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"mlflow server did not come up on {uri}:\n{tail}")
        time.sleep(0.5)
    return MlflowServer(uri, port, folder, process.pid, process)


def stop_server(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        # Its state is thrown away with the test's folder: no need to wait long for a clean exit.
        process.wait(STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


class Gate:
    """A loopback TCP forwarder to ``target_port``: ``close`` refuses connections (and cuts open ones),
    ``open`` listens again on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.open()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                if self._listener is listener:
                    # Out of file descriptors for a moment (many uploads at once): accept again.
                    time.sleep(0.05)
                    continue
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            # Both ends closed once a direction ends: a long bench (thousands of connections) would run
            # out of file descriptors with them kept open until the gate closes.
            with self._lock:
                for s in (source, sink):
                    if s in self._conns:
                        self._conns.remove(s)
                        s.close()


class StallingProxy:
    """An HTTP forwarder to ``target_port`` that holds the next ``times`` requests whose path holds
    ``path`` (``stall``) for ``seconds`` and then drops them unanswered; ``stalled`` counts them."""

    def __init__(self, target_port: int) -> None:
        self.stalled = 0
        self._rules: list[list[Any]] = []
        self._lock = threading.Lock()
        proxy = self
        upstream = f"http://127.0.0.1:{target_port}"

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                if proxy._take(self.path):
                    self.close_connection = True
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                skip = ("host", "content-length")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
                answer = httpx.request(self.command, upstream + self.path, headers=headers, content=body)
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def do_GET(self) -> None:
                self._forward()

            def do_POST(self) -> None:
                self._forward()

            def do_PUT(self) -> None:
                # The artifact proxy's uploads (each evaluation's file).
                self._forward()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stall(self, path: str, *, times: int, seconds: float) -> None:
        with self._lock:
            self._rules.append([path, times, seconds])

    def _take(self, path: str) -> bool:
        with self._lock:
            rule = next((r for r in self._rules if r[0] in path and r[1] > 0), None)
            if rule is None:
                return False
            rule[1] -= 1
            self.stalled += 1
        time.sleep(rule[2])
        return True

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every process of this pytest run shares: xdist's workers each have a basetemp below it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """The run's one plain server: started by its first user, stopped by its last (see the docstring)."""
    require_mlflow()
    root = _shared_root(tmp_path_factory)
    state, lock = root / "mlflow-server.json", root / "mlflow-server.lock"
    with _locked(lock):
        known = json.loads(state.read_text()) if state.exists() else None
        if known is not None and _healthy(known["uri"]):
            known["users"] += 1
            server = MlflowServer(known["uri"], known["port"], Path(known["folder"]), known["pid"], None)
        else:
            server = start_server(root / "mlflow-server")
            known = {
                "uri": server.uri,
                "port": server.port,
                "folder": str(server.folder),
                "pid": server.pid,
                "users": 1,
            }
        state.write_text(json.dumps(known))
    try:
        yield server
    finally:
        with _locked(lock):
            known = json.loads(state.read_text())
            known["users"] -= 1
            if known["users"] > 0:
                state.write_text(json.dumps(known))
            else:
                state.unlink()
                stop(server)


def stop(server: MlflowServer) -> None:
    """Stop ``server``, whichever process of this run started it."""
    if server.process is not None:
        stop_server(server.process)
        return
    pid = server.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = Deadline(STOP_WAIT_S)
    while not deadline.expired():
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    yield from shared_server(tmp_path_factory)


def _auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    require_mlflow()
    if importlib.util.find_spec("flask_wtf") is None:
        message = "mlflow's basic-auth app needs Flask-WTF (pip install 'mlflow[auth]')"
        if os.environ.get("EVALD_REQUIRE_MLFLOW") == "1":
            pytest.fail(message)
        pytest.skip(message)
    server = start_server(tmp_path_factory.mktemp("mlflow-auth-server"), auth=True)
    try:
        yield server
    finally:
        stop(server)


def mlflow_auth_server_fixture() -> Any:
    """A second server, with ``--app-name basic-auth`` (user ``ADMIN``): its own start (70-120 s), so the
    one test that binds it is marked long."""
    return pytest.fixture(scope="session")(_auth_server)


def mlflow_server_fixture() -> Any:
    """The run's shared server, for a test module to bind: ``mlflow_server = mlflow_server_fixture()``."""
    return pytest.fixture(scope="session")(_server)
