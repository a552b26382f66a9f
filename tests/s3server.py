"""A real S3 API server on loopback for the object-storage tests: moto's server mode (``moto_server``).

Started once per test session (per xdist worker: it comes up in about a second), with authentication on:
an IAM user and access key are made while moto still answers unauthenticated requests (its first
``INITIAL_NO_AUTH_ACTION_COUNT`` actions), after which every request must be signed with that key, so a
wrong key or secret is refused with S3's own ``InvalidAccessKeyId`` / ``SignatureDoesNotMatch``. moto
keeps its state in memory, so an outage is modelled by pausing the process (SIGSTOP: connections are
accepted by the kernel and never answered, as a store that hangs) and resuming it (SIGCONT) with the
same data. Tests isolate themselves by bucket name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.deadlines import Deadline, wait_process
from tests.harness import free_port

ACCESS_ENV = "EVALD_TEST_S3_KEY"
SECRET_ENV = "EVALD_TEST_S3_SECRET"
#: The IAM actions made before authentication is enforced (user, key, policy).
_SETUP_ACTIONS = 3


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]
    access_key: str
    secret_key: str

    @property
    def env(self) -> dict[str, str]:
        """The environment a run's ``access_key_env``/``secret_key_env`` names read the key from."""
        return {ACCESS_ENV: self.access_key, SECRET_ENV: self.secret_key}

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=32),
        )

    def bucket(self) -> str:
        """A new empty bucket, named for one test."""
        name = f"t-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        return name

    def settings(self, cache_dir: Path, **extra: object) -> dict[str, object]:
        """A run's ``[runs.s3]`` table reaching this server."""
        return {
            "endpoint_url": self.endpoint,
            "access_key_env": ACCESS_ENV,
            "secret_key_env": SECRET_ENV,
            "cache_dir": str(cache_dir),
            "timeout_secs": 1.0,
            **extra,
        }

    def run_section(self, bucket: str, cache_dir: Path, *, prefix: str = "toy", extra: str = "") -> str:
        """A config's ``[[runs]]`` entry named ``cloud`` for ``s3://bucket/prefix`` on this server."""
        return f"""
[[runs]]
name = "cloud"
root = "s3://{bucket}/{prefix}"
[runs.s3]
endpoint_url = "{self.endpoint}"
access_key_env = "{ACCESS_ENV}"
secret_key_env = "{SECRET_ENV}"
cache_dir = "{cache_dir}"
{extra}
"""

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The store hangs (SIGSTOP) inside the block and answers again (SIGCONT) after it."""
        os.kill(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.process.pid, signal.SIGCONT)


def upload(client: Any, bucket: str, source: Path, prefix: str, *, skip: tuple[str, ...] = ()) -> None:
    """Upload every file under ``source`` below ``prefix``, as ``aws s3 cp --recursive`` does."""
    for path in sorted(source.rglob("*")):
        relpath = path.relative_to(source).as_posix()
        if path.is_file() and relpath not in skip:
            client.put_object(Bucket=bucket, Key=f"{prefix}/{relpath}", Body=path.read_bytes())


def _start() -> S3Server:
    executable = Path(sys.executable).with_name("moto_server")
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_ACTIONS)}
    process = subprocess.Popen(
        [str(executable), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = Deadline(60)
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
            break
        except OSError:
            if process.poll() is not None or deadline.expired():
                process.kill()
                raise RuntimeError(f"moto_server did not start on {endpoint}") from None
            time.sleep(0.1)
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )
    iam.create_user(UserName="evald")
    key = iam.create_access_key(UserName="evald")["AccessKey"]
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_user_policy(UserName="evald", PolicyName="all", PolicyDocument=json.dumps(policy))
    return S3Server(endpoint, process, key["AccessKeyId"], key["SecretAccessKey"])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("boto3", reason="the object-storage tests need evald[s3] and moto[server] (dev)")
    server = _start()
    try:
        yield server
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
        server.process.terminate()
        try:
            wait_process(server.process, 10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
