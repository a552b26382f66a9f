"""The suite's fork server (tests/forkserver.py) gives the workers a fresh interpreter would, and a forked
worker behaves as a process of its own toward whoever started it: its exit status and signals pass
through its client, and a killed client takes its worker with it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from daemon.config import Config, InferenceConfig, RunConfig, TaskConfig
from daemon.running.environment import worker_environment
from inference.launcher import worker_command
from inference.spec import InferenceSpec, JobResult, JobSpec, TaskSpec
from inference.toy.problems import PROMPT_TEMPLATE, held_out_problems, write_jsonl
from tests import forkserver
from tests.conftest import SUBPROCESS_ENV, ToyRun
from tests.deadlines import patient
from tests.fork_client import _message, cli_forkable, forkable, torchrun_forkable
from tests.harness import DaemonProcess, evald, log_events, upgraded, wait_for, write_config, write_dataset
from tests.session_cache import cache_root

pytestmark = pytest.mark.skipif(
    forkserver.PYTHON_OVERRIDE_ENV not in os.environ, reason="the fork server is off (EVALD_TEST_FORK=0)"
)


def notes() -> list[dict[str, object]]:
    log = cache_root() / "forks" / "forkserver.log"
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def forked_pid(spec_path: Path) -> int | None:
    for note in notes():
        if note["event"] == "forked" and note["argv"] == ["-m", "inference.worker", str(spec_path)]:
            pid = note["pid"]
            assert isinstance(pid, int)
            return pid
    return None


def write_job(checkpoint: Path, folder: Path, problems: int, batch_size: int = 8) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dataset = folder / "problems.jsonl"
    write_jsonl(held_out_problems(problems, seed=4), dataset)
    spec = JobSpec(
        job_id=5,
        checkpoint_path=checkpoint,
        result_path=folder / "result.json",
        task=TaskSpec(
            name="toy", dataset=dataset, prompt_template=PROMPT_TEMPLATE, id_field="id", batch_size=batch_size
        ),
        inference=InferenceSpec(threads=1),
        max_samples=problems,
    )
    path = folder / "spec.json"
    path.write_text(spec.model_dump_json(), encoding="utf-8")
    return path


def run(python: str, spec_path: Path) -> tuple[subprocess.CompletedProcess[str], JobResult]:
    done = subprocess.run(
        [python, "-m", "inference.worker", str(spec_path)],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=patient(120),
    )
    return done, JobResult.read(spec_path.parent / "result.json")


def test_a_forked_worker_gives_what_a_fresh_interpreter_gives(toy_run: ToyRun, tmp_path: Path) -> None:
    forked_spec = write_job(toy_run.last_checkpoint, tmp_path / "forked", 12)
    fresh_spec = write_job(toy_run.last_checkpoint, tmp_path / "fresh", 12)

    forked, forked_result = run(forkserver.worker_python(), forked_spec)
    fresh, fresh_result = run(sys.executable, fresh_spec)

    assert forked.returncode == fresh.returncode == 0, forked.stderr + fresh.stderr
    assert forked_pid(forked_spec) is not None, "the worker was not forked"
    assert forked_pid(fresh_spec) is None
    assert [(m.name, m.value, m.n) for m in forked_result.metrics if not m.name.endswith("_s")] == [
        (m.name, m.value, m.n) for m in fresh_result.metrics if not m.name.endswith("_s")
    ]
    assert [(s.prompt_id, s.response, s.correct) for s in forked_result.samples] == [
        (s.prompt_id, s.response, s.correct) for s in fresh_result.samples
    ]
    # Its log is the worker's own, on the streams its client was given.
    assert '"worker.finished"' in forked.stderr


def _start_long(toy_run: ToyRun, folder: Path) -> tuple[subprocess.Popen[bytes], psutil.Process]:
    """A worker busy for a while (one problem a batch), once it has started evaluating."""
    spec_path = write_job(toy_run.last_checkpoint, folder, 400, batch_size=1)
    log = folder / "worker.log"
    with log.open("wb") as out:
        client = subprocess.Popen(
            [forkserver.worker_python(), "-m", "inference.worker", str(spec_path)],
            stdout=out,
            stderr=out,
            env=SUBPROCESS_ENV,
            start_new_session=True,
        )
    pid = wait_for(lambda: forked_pid(spec_path), 30, "the fork server's child", client)
    wait_for(lambda: b'"worker.started"' in log.read_bytes(), 30, "the worker's start", client)
    return client, psutil.Process(pid)


def test_signals_and_deaths_pass_between_a_client_and_its_worker(toy_run: ToyRun, tmp_path: Path) -> None:
    # The worker dies of a signal: its client dies of the same one (the daemon reads "killed by SIGSEGV").
    client, child = _start_long(toy_run, tmp_path / "segv")
    child.send_signal(signal.SIGSEGV)
    assert client.wait(timeout=patient(30)) == -signal.SIGSEGV
    # And of SIGKILL (the OOM killer's), whose handler the client cannot set before raising it.
    client, child = _start_long(toy_run, tmp_path / "oom")
    child.send_signal(signal.SIGKILL)
    assert client.wait(timeout=patient(30)) == -signal.SIGKILL

    # A signal to the client reaches the worker.
    client, child = _start_long(toy_run, tmp_path / "term")
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=patient(30)) == -signal.SIGTERM
    _, alive = psutil.wait_procs([child], timeout=patient(10))
    assert not alive

    # A client killed outright takes its worker with it.
    client, child = _start_long(toy_run, tmp_path / "kill")
    client.kill()
    client.wait()
    _, alive = psutil.wait_procs([child], timeout=patient(10))
    assert not alive


def test_an_environment_imports_read_differently_gets_a_fresh_interpreter(tmp_path: Path) -> None:
    missing = tmp_path / "no-spec.json"
    done = subprocess.run(
        [forkserver.worker_python(), "-m", "inference.worker", str(missing)],
        capture_output=True,
        text=True,
        env={**SUBPROCESS_ENV, "HF_HOME": str(tmp_path / "hf")},
        timeout=patient(60),
    )

    assert done.returncode == 1
    assert "FileNotFoundError" in done.stderr and str(missing) in done.stderr
    declined = [
        n
        for n in notes()
        if n["event"] == "declined" and n["argv"] == ["-m", "inference.worker", str(missing)]
    ]
    assert [n["reason"] for n in declined] == [f"{forkserver.DIFFERENT_ENVIRONMENT}: HF_HOME"]


def test_the_local_executors_worker_command_is_one_the_shim_forks(tmp_path: Path) -> None:
    # The daemons of the suite take their workers from the server only while the local executor's command
    # and environment keep this shape: this fails, rather than the suite slowing down unseen.
    (tmp_path / "d.jsonl").write_text('{"id": "1", "problem": "1+1", "answer": "2"}\n')
    config = Config(
        runs=(RunConfig(name="r", root=tmp_path / "run"),),
        tasks=(TaskConfig(name="t", dataset=tmp_path / "d.jsonl"),),
        inference=InferenceConfig(python=Path(forkserver.worker_python())),
    )
    spec_path = tmp_path / "spec.json"
    command = worker_command(InferenceSpec(), spec_path, python=forkserver.worker_python(), hostfile=None)
    # As a daemon started now from this test process would pass it on: with what imports here set.
    env = worker_environment(config, os.environ)

    assert command[0] == forkserver.worker_python() == os.environ[forkserver.PYTHON_OVERRIDE_ENV]
    assert forkable(command[1:], env, os.getpid())
    assert forkserver.import_settings(env) == forkserver.import_settings(
        forkserver.worker_like_environment(dict(os.environ))
    )
    # A group's launcher is not forked, its ranks are (torchrun starts them as `-u -m inference.worker`,
    # tied to itself); a worker some other process than its daemon started is not.
    group = worker_command(InferenceSpec(tp=2), spec_path, python="py", hostfile=None)
    assert not forkable(group[1:], env, os.getpid())
    assert group[-3:] == ["--module", "inference.worker", str(spec_path)]
    assert forkable(["-u", "-m", "inference.worker", str(spec_path)], env, os.getpid())
    assert not forkable(command[1:], env, os.getpid() + 1)
    # A Slurm job's task is forked (Slurm tracks the client, which passes signals on); a process Ray
    # started is not.
    assert forkable(command[1:], {**env, "SLURM_JOB_ID": "7"}, os.getpid())
    assert not forkable(command[1:], {**env, "RAY_RAYLET_PID": "7"}, os.getpid())
    # A test process that imported ray (RAY_CLIENT_MODE) starts its programs as any other does.
    assert forkable(command[1:], {**env, "RAY_CLIENT_MODE": "0"}, os.getpid())
    # torchrun as the launcher execs into it (its ranks tied to this pid) is forked; one whose ranks are
    # tied elsewhere, or a scheduler's, is not.
    torchrun = [*group[group.index("-m", 4) :][:2], "--standalone", "--module", "inference.worker", "s.json"]
    assert torchrun[:2] == ["-m", "torch.distributed.run"]
    own = str(os.getpid())
    assert torchrun_forkable(torchrun, {**env, "EVALD_PARENT_PID": own}, os.getpid())
    assert not torchrun_forkable(torchrun, {**env, "EVALD_PARENT_PID": str(os.getppid())}, os.getpid())
    assert not torchrun_forkable(torchrun, {**env, "EVALD_PARENT_PID": own, "SLURM_JOB_ID": "7"}, os.getpid())
    assert not torchrun_forkable(command[1:], {**env, "EVALD_PARENT_PID": own}, os.getpid())
    # The daemon must not hold torch: never forked from the workers' server.
    assert not forkable(["-m", "daemon", "--config", "evald.toml", "run"], env, os.getpid())


def cli_notes() -> list[dict[str, object]]:
    log = cache_root() / "forks" / "cliserver.log"
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_evald_commands_and_daemons_are_forked_and_servers_and_the_demo_are_not() -> None:
    assert cli_forkable(["-m", "daemon", "--config", "evald.toml", "status"])
    assert cli_forkable(["-m", "daemon", "results", "--run", "toy", "--format", "json"])
    assert cli_forkable(["-m", "daemon", "--config", "evald.toml", "run"])
    for long in ("serve", "demo"):
        assert not cli_forkable(["-m", "daemon", "--config", "evald.toml", long])
    assert not cli_forkable(["-m", "inference.worker", "spec.json"])
    assert not cli_forkable(["-c", "print(1)"])
    assert forkserver.cli_python() == os.environ[forkserver.CLI_PYTHON_ENV] != sys.executable


def test_the_client_reads_a_pid_and_an_end_sent_in_one_write_as_two_messages() -> None:
    # A command that ends at once (`evald config check`): the server's two lines can reach the client in
    # one chunk (a loaded run failed test_code_daemon so, with "Extra data" from json).
    server, client = socket.socketpair()
    with server, client, client.makefile("rb") as reader:
        server.sendall(b'{"pid": 41}\n{"exit": 0}\n')
        assert _message(reader) == {"pid": 41}
        assert _message(reader) == {"exit": 0}
        server.sendall(b'{"exit"')
        server.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionError, match="closed the connection"):
            _message(reader)


def test_a_forked_evald_command_answers_as_a_fresh_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    upgraded(url).dispose()
    good = write_config(tmp_path, url, dataset=write_dataset(tmp_path / "d.jsonl", 2))
    broken = tmp_path / "broken.toml"
    broken.write_text(good.read_text().replace("[daemon]\n", "[daemon]\nsurprise = 1\n", 1))
    for config in (good, broken):
        for command in (["config", "check"], ["status"], ["results", "--run", "toy", "--format", "json"]):
            args = ["--config", str(config), *command]
            forked = evald(*args)
            fresh = subprocess.run(
                [sys.executable, "-m", "daemon", *args], capture_output=True, text=True, timeout=patient(60)
            )
            said = (forked.returncode, forked.stdout, forked.stderr)
            assert said == (fresh.returncode, fresh.stdout, fresh.stderr), (args, said, fresh)
            assert any(n["event"] == "forked" and n["argv"] == ["-m", "daemon", *args] for n in cli_notes())
    # The commands said what they say (not two equal crashes).
    assert evald("--config", str(good), "config", "check").returncode == 0
    assert "surprise" in evald("--config", str(broken), "config", "check").stderr


def test_a_forked_daemon_takes_its_signals_and_exits_as_a_fresh_one(tmp_path: Path) -> None:
    # The tests' daemons are forked (tests.harness.DaemonProcess): the process a test holds passes SIGHUP
    # and SIGTERM to the daemon and ends as it did.
    url = f"sqlite:///{tmp_path / 'evald.db'}"
    upgraded(url).dispose()
    config = write_config(tmp_path, url, dataset=write_dataset(tmp_path / "d.jsonl", 2))
    daemon = DaemonProcess(config, tmp_path / "daemon.log")
    daemon.wait_ready()
    argv = ["-m", "daemon", "--config", str(config), "run"]
    forked = [n for n in cli_notes() if n["event"] == "forked" and n["argv"] == argv]
    assert len(forked) == 1 and forked[0]["pid"] != daemon.process.pid
    daemon.process.send_signal(signal.SIGHUP)
    wait_for(lambda: log_events(daemon.log, "config.reloaded") or None, 30, "the reload", daemon.process)
    assert daemon.stop(signal.SIGTERM) == 0
    assert len(log_events(daemon.log, "daemon.stopped")) == 1
    assert len(log_events(daemon.log, "daemon.ready")) == 1
