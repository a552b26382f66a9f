"""The tests' stand-in for ``python``: ``python -m inference.worker SPEC`` forked from a preloaded process.

An evaluation worker spends about 4 of its 4.5 CPU seconds importing torch, transformers, DeepSpeed and
math-verify; the suite starts over a hundred of them. The session's fork server (:mod:`tests.forkserver`)
imports those once, and this client, run by the session's ``bin/python`` shim in the worker's place, asks
it for a worker: a child forked with this process's standard streams, working folder, environment and
arguments, in a session of its own. This process stays the worker as the daemon sees it: its pid is the
job's handle and its command line names the spec; it passes signals on to the child and exits as the
child did (its exit status, or killed by the same signal). A SIGKILL, which cannot be passed on, closes
the connection, and the server kills the child at once.

Tests run their other programs that import the same (a layout writer, lm-eval's command) with the shim
too, and their short ``evald`` commands with the CLI shim, which asks the session's CLI server
(:func:`cli_forkable`: a command spent 0.3 CPU-s importing SQLAlchemy, pydantic and the config, some
170 a run). A Slurm job's worker is forked too (srun's task is this client). Anything else (``-m
inference.launcher``, ``-m torch.distributed.run`` but as evald's launcher runs it, a process Ray started,
a worker whose environment differs from the server's where imports read it) runs the real interpreter in
place (``execv``), so those paths are what they are without the suite. torchrun is told to
start its ranks with this shim (``PYTHON_EXEC``): they are forked too, each the client of its own child.

Standard library only: the shim runs it with ``-I -S`` (no site-packages), in a few milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import BinaryIO, NoReturn

#: The tie to the daemon that started this worker (inference.spec.PARENT_PID_ENV).
PARENT_PID_ENV = "EVALD_PARENT_PID"
#: Signals a daemon or a test may send a worker: passed on to the forked child's process group.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_PDEATHSIG = 1
#: Modules :func:`forkable` leaves to the real interpreter: launchers (they exec, or start processes of
#: their own: torchrun is forked by its own rule, :func:`torchrun_forkable`) and evald's daemon and CLI
#: (which must not hold torch's and transformers' modules).
EXECUTED_MODULES = ("inference.launcher", "torch.distributed.run", "deepspeed.launcher", "daemon")
#: What ``import ray`` sets in whatever process imports it (a test process that used the Ray cluster): no
#: sign of a process Ray started, whose environment has Ray's own (``RAY_RAYLET_PID``, ``RAY_ADDRESS``).
RAY_IMPORTED = frozenset({"RAY_CLIENT_MODE"})
#: How the launcher starts torchrun (``python -m torch.distributed.run ...``).
TORCHRUN = ["-m", "torch.distributed.run"]
#: The interpreter torchrun starts its ranks with (torch/distributed/run.py).
TORCHRUN_PYTHON_ENV = "PYTHON_EXEC"
#: Commands of the CLI that run a server or a whole demo (which starts its own processes): never forked by
#: the CLI shim, which forks the others (``status``, ``config check`` ..., and ``run``: the daemon). A word
#: among the arguments is enough to decline (``--run serve`` too): the safe way to be wrong.
LONG_COMMANDS = frozenset({"serve", "demo"})


def forkable(argv: list[str], environ: dict[str, str], parent: int) -> bool:
    """Whether ``python ARGV`` may be forked: a module (``-m M ...``) or a script (``S.py ...``), the
    evaluation worker or a program of the tests' that imports what it does (a layout writer, lm-eval's
    command), with or without ``-u`` (torchrun starts its ranks so); not a launcher, which execs or
    starts processes of its own, nor the daemon, which must not hold torch; tied to the process that
    started it; not a process Ray started (Ray owns its workers). A Slurm job's task is forked: Slurm
    tracks this client, which passes the job's signals on (``scancel``, the time limit) and whose death
    takes its child with it, as in a daemon's local job."""
    if argv[:1] == ["-u"]:
        argv = argv[1:]
    if argv[:1] == ["-m"]:
        if len(argv) < 2 or argv[1].startswith(EXECUTED_MODULES):
            return False
    elif not argv or not argv[0].endswith(".py"):
        return False
    if _ray_started(environ):
        return False
    tie = environ.get(PARENT_PID_ENV)
    return tie is None or tie == str(parent)


def torchrun_forkable(argv: list[str], environ: dict[str, str], pid: int) -> bool:
    """Whether ``python ARGV`` is torchrun as evald's launcher runs it: the launcher, which execs into it,
    tied the ranks to itself (``EVALD_PARENT_PID``: this very pid) and to die with its daemon (a death
    signal an exec keeps); not under Slurm or Ray."""
    return argv[:2] == TORCHRUN and environ.get(PARENT_PID_ENV) == str(pid) and not _scheduled(environ)


def _scheduled(environ: dict[str, str]) -> bool:
    """Whether a scheduler started this process (a Slurm job's or Ray's)."""
    return "SLURM_JOB_ID" in environ or _ray_started(environ)


def _ray_started(environ: dict[str, str]) -> bool:
    """Whether Ray started this process (its environment has Ray's own variables)."""
    return any(name.startswith("RAY_") and name not in RAY_IMPORTED for name in environ)


def cli_forkable(argv: list[str]) -> bool:
    """Whether ``python ARGV`` is an evald command the CLI shim may fork: ``-m daemon ...``, not one of
    :data:`LONG_COMMANDS` (whatever the environment: a test process that imported Ray carries ``RAY_``
    variables, which no evald command reads)."""
    return argv[:2] == ["-m", "daemon"] and not LONG_COMMANDS.intersection(argv[2:])


def _die_with_parent() -> None:
    """As inference.lifeline.die_with_parent: this process goes when the daemon that started it does,
    and the server then kills the child."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if str(os.getppid()) != os.environ.get(PARENT_PID_ENV):
        os._exit(1)


def _message(reader: BinaryIO) -> dict[str, object]:
    """The server's next message: one JSON line. A buffered reader, not ``recv`` until a newline: a
    command that ends at once sends its pid and its end in one write, both lines in one chunk."""
    line = reader.readline()
    if not line.endswith(b"\n"):
        raise ConnectionError("the fork server closed the connection")
    answer: dict[str, object] = json.loads(line)
    return answer


def _exit_as(answer: dict[str, object]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    killed = answer.get("signal")
    if isinstance(killed, int):
        # The daemon reads "killed by SIGSEGV" from the exit status: die of the same signal, no core.
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if killed != signal.SIGKILL:  # (its handler cannot be set: it is always the default)
            signal.signal(killed, signal.SIG_DFL)
        os.kill(os.getpid(), killed)
    code = answer.get("exit")
    os._exit(code if isinstance(code, int) else 1)


def main(real_python: str, socket_path: str, kind: str = "worker") -> NoReturn:
    """Run ``python ARGV`` forked where it may be; ``kind``: ``worker`` (the daemons' and tests' worker
    shim) or ``cli`` (the tests' ``evald`` calls: :func:`cli_forkable`)."""
    argv = sys.argv[1:]
    environ = dict(os.environ)
    if kind == "cli":
        if not cli_forkable(argv):
            os.execv(real_python, [real_python, *argv])
    elif argv[:2] == TORCHRUN:
        # torchrun starts each rank with PYTHON_EXEC (its documented override of sys.executable): this
        # shim, so that the ranks are forked too.
        environ[TORCHRUN_PYTHON_ENV] = sys.argv[0]
        if not torchrun_forkable(argv, environ, os.getpid()):
            os.execve(real_python, [real_python, *argv], environ)
    elif not forkable(argv, environ, os.getppid()):
        os.execv(real_python, [real_python, *argv])
    if PARENT_PID_ENV in environ and argv[:2] != TORCHRUN:
        # (torchrun's launcher set its own death signal, which its exec into this shim kept.)
        _die_with_parent()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(socket_path)
        request = {"argv": argv, "env": environ, "cwd": str(Path.cwd())}
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
        reader = conn.makefile("rb")
        answer = _message(reader)
    except OSError:
        conn.close()
        # (With the environment as asked for: torchrun's names this shim for its ranks.)
        os.execve(real_python, [real_python, *argv], environ)
    pid = answer.get("pid")
    if not isinstance(pid, int):
        # Declined (its environment differs where imports read it): a fresh interpreter, as without us.
        conn.close()
        os.execve(real_python, [real_python, *argv], environ)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            if kind == "cli":
                # To the command (a daemon) alone, as a signal to its pid: what it started is its own.
                os.kill(pid, signum)
                return
            try:
                os.killpg(pid, signum)
            except ProcessLookupError:
                # Not yet past its setsid (a signal sent as the worker starts): its pid is all there is.
                os.kill(pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        ended = _message(reader)
    except ConnectionError:
        print("fork client: the fork server went before the worker ended", file=sys.stderr)
        os._exit(1)
    _exit_as(ended)
