"""What a worker inherits is an allow-list: what it needs (PATH, HOME, CUDA_*, HF_*, ...) and
``[inference] worker_env``, never the daemon's secrets nor anything else of its environment. Checked on a
real worker of a real ``evald run``, by reading its ``/proc/PID/environ``."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import psutil
import pytest

from daemon.config import parse_config
from daemon.errors import ConfigError
from daemon.running.environment import needed, worker_environment
from tests.checkpoints import copy_checkpoint
from tests.conftest import ToyRun
from tests.harness import (
    all_jobs_done,
    running_daemon,
    upgraded,
    wait_for,
    worker_processes,
    write_config,
    write_dataset,
)

TOKEN = "dashboard-token-0b9d7c5e"
#: What the daemon's environment holds that no worker may see, by name and value.
KEPT_OUT = {
    "DASHBOARD_TOKEN": TOKEN,  # the dashboard's token, named by [web] token_env
    "PGPASSWORD": "pg-password-51f3",
    "FOO_SECRET": "foo-secret-9e2a",
    "HF_TOKEN": "hf_token_7c1d",  # under an allowed prefix, but a credential: the worker runs offline
    "NOT_LISTED": "anything-else",
    "MASTER_ADDR": "10.9.9.9",  # a launcher's, from a training job's shell
    "RANK": "3",
}
#: What a worker needs, and one variable the config adds.
PASSED = {
    "LANG": "C.UTF-8",
    "TZ": "UTC",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "REWARD_API_URL": "http://127.0.0.1:9/score",
}


def _config(tmp_path: Path, url: str, dataset: Path, extra: str = "") -> Path:
    path = write_config(
        tmp_path, url, dataset=dataset, batch_size=2, inference_extra='worker_env = ["REWARD_API_URL"]'
    )
    with path.open("a") as more:
        more.write(f'\n[web]\ntoken_env = "DASHBOARD_TOKEN"\n{extra}')
    return path


def test_the_allow_list_keeps_what_a_worker_needs_and_nothing_else(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    path = _config(tmp_path, "sqlite:///x.db", data)
    config = parse_config(tomllib.loads(path.read_text()), base_dir=tmp_path, source=str(path), environ={})
    environ = {
        **KEPT_OUT,
        **PASSED,
        "PATH": "/usr/bin",
        "HOME": "/home/evald",
        "HF_HOME": "/cache/hf",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "PYTHONPATH": "/opt/lib",
        "LC_ALL": "C.UTF-8",
        "EVALD_DATABASE_URL": "postgresql://u:pw@db/evald",
        "EVALD_SIMULATE_OOM_ABOVE_BATCH": "2",
    }
    env = worker_environment(config, environ)
    assert not set(KEPT_OUT) & set(env) and "EVALD_DATABASE_URL" not in env
    for name in (*PASSED, "PATH", "HOME", "HF_HOME", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "LC_ALL"):
        assert env[name] == environ[name], name
    assert env["EVALD_SIMULATE_OOM_ABOVE_BATCH"] == "2"  # a test's fault injection reaches the worker
    assert env["EVALD_PARENT_PID"] == str(os.getpid()) and env["DS_ACCELERATOR"] == "cpu"
    assert needed("NCCL_SOCKET_IFNAME") and needed("SSL_CERT_FILE") and not needed("HF_HUB_TOKEN")


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ('["MASTER_ADDR"]', "inference.worker_env[0]: MASTER_ADDR is set by the launcher"),
        ('["OK", "PGPASSWORD"]', "inference.worker_env[1]: PGPASSWORD is a PostgreSQL client setting"),
        (
            '["EVALD_DATABASE_URL"]',
            "inference.worker_env[0]: EVALD_DATABASE_URL is the daemon's own configuration",
        ),
        ('["not a name"]', "inference.worker_env[0]: 'not a name' is not an environment variable name"),
        (
            '["DASHBOARD_TOKEN"]',
            "inference.worker_env[0]: DASHBOARD_TOKEN holds the daemon's secret (web.token_env)",
        ),
        ('["HOOK"]', "inference.worker_env[0]: HOOK holds the daemon's secret (webhooks[0].secret_env)"),
    ],
)
def test_worker_env_refuses_what_a_worker_must_not_inherit(
    listed: str, expected: str, tmp_path: Path
) -> None:
    data = write_dataset(tmp_path / "arith.jsonl", 4)
    path = write_config(tmp_path, "sqlite:///x.db", dataset=data, inference_extra=f"worker_env = {listed}")
    with path.open("a") as more:
        more.write(
            '\n[web]\ntoken_env = "DASHBOARD_TOKEN"\n\n'
            '[[webhooks]]\nname = "w"\nurl = "http://127.0.0.1:9/h"\nsecret_env = "HOOK"\n'
        )
    with pytest.raises(ConfigError) as caught:
        parse_config(tomllib.loads(path.read_text()), base_dir=tmp_path, source=str(path), environ={})
    problems = "\n".join(caught.value.problems)
    assert expected in problems, problems


@pytest.mark.slow
def test_a_running_worker_holds_no_secret_of_the_daemon_and_what_it_needs(
    toy_run: ToyRun, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    database = upgraded(url)
    data = write_dataset(tmp_path / "arith.jsonl", 12)
    config = _config(tmp_path, url, data)
    copy_checkpoint(toy_run.last_checkpoint, tmp_path / "run" / "step_10")
    env = {**KEPT_OUT, **PASSED, "EVALD_DATABASE_URL": url, "HF_HOME": str(tmp_path / "hf")}
    with running_daemon(config, tmp_path / "daemon.log", env, fresh=True) as daemon:
        worker = wait_for(
            lambda: next((p for p in worker_processes(tmp_path / "state") if _environ(p)), None),
            120,
            "a running worker",
            daemon.process,
        )
        environ = _environ(worker)
        wait_for(lambda: all_jobs_done(database, 1), 240, "the job", daemon.process)
        assert daemon.stop() == 0
    assert set(KEPT_OUT).isdisjoint(environ), sorted(set(KEPT_OUT) & set(environ))
    # Nor under another name. Short values ("3" for RANK) stand inside any PID or path: whole values only.
    assert not set(KEPT_OUT.values()) & set(environ.values())
    secrets = [value for value in KEPT_OUT.values() if len(value) >= 8]
    assert not any(value in "\n".join(environ.values()) for value in secrets)
    assert "EVALD_DATABASE_URL" not in environ
    leaked = sorted(k for k in environ if k.startswith(("PYTEST", "EVALD_TEST", "EVALD_REQUIRE")))
    assert not leaked, leaked
    for name, value in PASSED.items():
        assert environ.get(name) == value, name
    assert environ["PATH"] == os.environ["PATH"] and environ["HOME"] == os.environ["HOME"]
    assert environ["HF_HOME"] == str(tmp_path / "hf")
    assert environ["EVALD_PARENT_PID"] == str(daemon.process.pid)
    [job] = all_jobs_done(database, 1) or []
    assert job.state == "succeeded"
    database.dispose()


def _environ(process: psutil.Process) -> dict[str, str]:
    """``/proc/PID/environ`` of ``process`` (empty if it is gone or not yet readable)."""
    try:
        return dict(process.environ())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return {}
