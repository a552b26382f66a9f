"""A private PostgreSQL server that a test may stop, kill and restart.

The shared server at 127.0.0.1:5432 serves every other test (and other people's runs), so outage tests
never touch it: they start their own cluster with the installed ``initdb``/``pg_ctl`` in a temporary
folder, on a free loopback port. PostgreSQL refuses to run as root, so as root the server runs as the
``postgres`` system user.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.deadlines import patient


class ClusterUnavailable(RuntimeError):
    """No PostgreSQL server binaries here, or the cluster would not start."""


def _bindir() -> Path:
    # Debian keeps the server binaries off PATH, one folder per major version: take the newest.
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl is None:
        raise ClusterUnavailable("pg_ctl not found (install the PostgreSQL server package)")
    return Path(pg_ctl).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class PrivateCluster:
    """One PostgreSQL cluster of our own: ``url`` reaches its ``postgres`` database over TCP."""

    root: Path
    port: int
    bindir: Path
    as_postgres: bool
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.root / "server.log"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=patient(60))
        if check and done.returncode != 0:
            said = done.stderr.strip() or done.stdout.strip()
            raise ClusterUnavailable(f"{' '.join(args[:2])} failed: {said}")
        return done

    def init(self) -> None:
        self.data.mkdir(parents=True)
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
            shutil.chown(self.data, "postgres", "postgres")
        self.data.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        settings = (
            f"port = {self.port}\n"
            "listen_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{self.root}'\n"
            # fsync off is safe here (the machine does not crash under the tests); synchronous_commit stays
            # on: an immediate stop must not lose a transaction the daemon was told had committed.
            "fsync = off\nfull_page_writes = off\n"
            "max_connections = 100\nshared_buffers = 32MB\n"
        )
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(settings)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "30", "start")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` ends sessions cleanly; ``immediate`` is a crash (no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop", check=False)

    def restart(self, down_secs: float = 0.0, mode: str = "fast") -> float:
        """Stop, stay down ``down_secs``, start again; returns how long the server did not answer."""
        began = time.monotonic()
        self.stop(mode)
        if down_secs > 0:
            time.sleep(down_secs)
        self.start()
        return time.monotonic() - began

    def is_up(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url().replace("postgresql+psycopg", "postgresql"), autocommit=True)

    def create_database(self, name: str) -> str:
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def terminate_connections(self, database: str) -> int:
        """Drop every session on ``database`` (what a failover or a proxy restart does to clients)."""
        with self.admin() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> "
                "pg_backend_pid()",
                (database,),
            ).fetchall()
        return len(rows)

    def destroy(self) -> None:
        if self.is_up():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> PrivateCluster:
    """Create and start a private cluster; the caller destroys it."""
    bindir = _bindir()
    if not (bindir / "initdb").exists():
        raise ClusterUnavailable(f"initdb not found in {bindir}")
    as_postgres = os.geteuid() == 0
    # /tmp, not pytest's tmp_path: the postgres user must be able to reach the folder.
    root = Path(tempfile.mkdtemp(prefix="evald-pg-"))
    root.chmod(0o755)
    cluster = PrivateCluster(root=root, port=_free_port(), bindir=bindir, as_postgres=as_postgres)
    try:
        cluster.init()
        cluster.start()
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return cluster


@pytest.fixture(scope="session")
def private_cluster() -> Iterator[PrivateCluster]:
    """A PostgreSQL server of this test session's own, to restart and kill (import it into a test module).

    Skipped with a message where no server binaries are installed, unless ``EVALD_REQUIRE_POSTGRES=1``.
    """
    try:
        cluster = start_cluster()
    except ClusterUnavailable as exc:
        message = f"cannot start a private PostgreSQL server: {exc}"
        if os.environ.get("EVALD_REQUIRE_POSTGRES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def private_database(private_cluster: PrivateCluster) -> str:
    """A fresh database on the private server; its URL."""
    return private_cluster.create_database(f"evald_{uuid.uuid4().hex[:12]}")
