"""The test session's fork server: evaluation workers forked from a process that imported their libraries.

``python -m tests.forkserver FD`` serves on the listening socket it inherits as ``FD``; at its first
request it imports what a CPU evaluation worker imports (:data:`WORKER_MODULES`: torch, transformers and
the Llama model code, DeepSpeed on its CPU accelerator, math-verify, lm-eval, evald's ``inference``
package, torchrun's modules) and fills the caches every worker would fill alike (:func:`warm_caches`),
about 5 CPU seconds, once per session instead of once per worker. Each connection from
:mod:`tests.fork_client` asks for one ``python -m inference.worker SPEC`` (or another of the tests'
programs that imports the same: a layout writer, lm-eval's command; :func:`tests.fork_client.forkable`):
the server forks a child that takes the client's standard streams, folder and environment, starts a
session of its own and runs the module (or script) as ``python`` would; the server answers the child's
pid, and its exit status when it ends. A client that goes (killed) takes its child with it. A forked
torchrun reads its rendezvous events' names from the frame (:func:`_method_name`): what a fresh one
reads, without the cost the fork's modules add.

The server declines (and the client runs a fresh interpreter) when the child could differ from a fresh
worker: a spec for a CUDA device (CUDA must not be set up before a fork, and the server never touches
it), or an environment that differs from the server's in a variable that imports read (the libraries'
``HF_``, ``TORCH_``, ``DS_``, thread-pool and ``PYTHON`` settings, ``HOME``).

:func:`start_session` starts it for a test session and writes the ``bin/python`` shim that the session's
daemons use as ``[inference] python`` (``EVALD_INFERENCE_PYTHON``). It starts a second server of the kind
``cli`` beside it, for the tests' short ``evald`` commands (``harness.evald``, through ``bin/evald-python``):
it imports what those import (:data:`CLI_MODULES`: SQLAlchemy, pydantic, the config), never torch, and
forks every command but a daemon's, a server's or the demo (:func:`tests.fork_client.cli_forkable`).
``EVALD_TEST_FORK=0`` turns both off: every worker and command a fresh interpreter, as ``make test-long``
runs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import psutil
import setproctitle

from tests.fork_client import TORCHRUN

#: Variables whose values imports read: a request that differs from the server in one of them is declined.
IMPORT_PREFIXES = (
    "PYTHON",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH",
    "PYTORCH_",
    "DS_",
    "DEEPSPEED",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "TRITON_",
    "TQDM_",
)
IMPORT_NAMES = frozenset({"HOME", "LD_LIBRARY_PATH", "LD_PRELOAD", "XDG_CACHE_HOME"})
#: Variables of torch.distributed, read when a process group starts or fails (torchrun sets them per rank).
RUNTIME_PREFIXES = ("TORCHELASTIC_", "TORCH_NCCL_")
#: Variables an import reads that the child applies itself, as the import would have (:func:`apply_threads`).
APPLIED_IN_CHILD = frozenset({"OMP_NUM_THREADS"})
#: Variables left out of the comparison: those libraries set in their own process when imported, to their
#: own defaults (a test process that imported them passes them on to the daemons it starts, and a fresh
#: worker would read the same values), and torchrun's, which no import reads.
UNCOMPARED = frozenset(
    {
        "KMP_DUPLICATE_LIB_OK",  # scikit-learn
        "PYTORCH_NVML_BASED_CUDA_CHECK",  # accelerate
        "HF_XET_HIGH_PERFORMANCE",  # lm-eval
        "TORCHINDUCTOR_CACHE_DIR",  # torch._inductor
        "PYTHON_EXEC",  # torchrun's interpreter for its ranks, read by nothing else
        "TORCH_EXTENSIONS_DIR",  # read when an op is built or loaded (torch.utils.cpp_extension)
    }
)
#: Environment switch: "0" runs every worker in a fresh interpreter.
SWITCH_ENV = "EVALD_TEST_FORK"
#: The reason a request is declined for its environment (the variables follow).
DIFFERENT_ENVIRONMENT = "an environment imports read differently"
PYTHON_OVERRIDE_ENV = "EVALD_INFERENCE_PYTHON"
#: The tests' own variable for the CLI shim (harness.evald): evald reads no ``EVALD_TEST_`` variable.
CLI_PYTHON_ENV = "EVALD_TEST_CLI_PYTHON"
PARENT_PID_ENV = "EVALD_PARENT_PID"


def _worker_defaults(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` as a CPU worker sees it once its ``main`` set its defaults (inference.worker)."""
    from inference.worker import quiet_libraries

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(environ)
        quiet_libraries()
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        return dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def apply_threads(env: dict[str, str]) -> None:
    """In a forked child: the thread count a fresh interpreter would take from ``OMP_NUM_THREADS`` when
    torch's OpenMP loaded (torchrun sets it to 1 for its ranks)."""
    value = env.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        import torch

        torch.set_num_threads(int(value))


def import_settings(environ: dict[str, str], kind: str = "worker") -> dict[str, str]:
    """The variables of ``environ`` that imports read, as a process of ``kind`` sees them (a worker: with the
    defaults its ``main`` sets)."""
    seen = KINDS[kind].defaults(environ)
    return {
        name: value
        for name, value in seen.items()
        if (name in IMPORT_NAMES or name.startswith(IMPORT_PREFIXES))
        and name not in UNCOMPARED
        and name not in APPLIED_IN_CHILD
        and not name.startswith(RUNTIME_PREFIXES)
    }


#: What a CPU worker running the toy model imports, in the order its ``main`` does (after its quieting and
#: mlflow block); then what a worker of an lm-eval task adds (lm-eval's task index, evaluator and model
#: wrapper: ~1 CPU-s of each such worker, nine a run), and what torchrun imports, for the launches forked.
WORKER_MODULES = (
    "deepspeed",
    "math_verify",
    "torch",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "inference.faults",
    "inference.group",
    "inference.task",
    "lm_eval.evaluator",
    "lm_eval.tasks",
    "inference.harness.model",
    "torch.distributed.run",
)


def preload() -> None:
    """Import what the workers import (:data:`WORKER_MODULES`) and fill the caches they fill alike."""
    import importlib

    from inference import worker

    worker.quiet_libraries()
    worker.skip_mlflow()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for name in WORKER_MODULES:
        importlib.import_module(name)
    # transformers' lazy names import their modules when first read.
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    warm_caches()


def warm_caches() -> None:
    """Fill, once in the server, what every forked worker would otherwise compute for itself, the same way
    each time: transformers' checkpoint conversion table, which ``from_pretrained`` builds at its first call
    (a few hundred regular expressions compiled: a quarter of the forked workers' py-spy samples over a
    whole ``make test``, 2026-12-07), and math-verify's LaTeX parser, whose ANTLR lexer and parser build
    their tables at a process's first parse (a forked child grading four answers: 0.096 CPU-s cold, 0.016
    warm). A fresh worker builds each once as well."""
    from transformers import conversion_mapping

    from inference import grading

    conversion_mapping.get_checkpoint_conversion_mapping("llama")  # type: ignore[no-untyped-call]
    for response, reference in (("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"), ("The answer is 42", "42")):
        grading.grade(response, reference, shortcut=False)


def _method_name(depth: int = 2) -> str:
    """torchrun's ``get_method_name`` (the function ``depth`` frames up, named in each rendezvous event it
    records) read from the frame, as ``inspect.stack()[depth].function`` reads it, without building the
    whole stack: for each frame of it ``inspect`` visits every module of the process. A fresh torchrun has
    about a thousand; one forked from this server has the four thousand a worker imports, and nearly all of
    a forked torchrun's py-spy samples were there (72 → 7 in test_worker_group): a cost only the fork adds."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:
        return "no_method_name"


def _in_torchrun() -> None:
    """What a forked torchrun changes before it runs: :func:`_method_name` for torch's."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    dynamic_rendezvous.get_method_name = _method_name


#: What evald's commands import (``status``, ``results``, ``config check``, ``history``, ``retry``,
#: ``alerts``, ``samples``, ``compare``, ``db upgrade``: read with ``python -X importtime``; and ``run``,
#: the daemon's service): SQLAlchemy with both databases' drivers, pydantic and the config's models,
#: structlog, APScheduler, watchdog, httpx. Never torch, which the daemon must not hold. A module a command
#: adds later is imported by that command, as before: the list only saves time.
CLI_MODULES = (
    "daemon.cli",
    "daemon.cli.base",
    "daemon.cli.parser",
    "daemon.cli.run",
    "daemon.config",
    "daemon.analysis.compare",
    "daemon.analysis.report",
    "daemon.analysis.run_rows",
    "daemon.analysis.run_status",
    "daemon.anomaly",
    "daemon.log",
    "daemon.scheduling",
    "daemon.watching.runs",
    "daemon.web.exposure",
    "inference.rows",
    "storage.alerting",
    "storage.database",
    "storage.migrations",
    "storage.queries",
    "storage.schema",
    "sqlalchemy.dialects.postgresql.psycopg",
    "sqlalchemy.dialects.sqlite",
    "structlog",
)


def preload_cli() -> None:
    """Import what the short evald commands import (:data:`CLI_MODULES`); no torch: none of them does."""
    import importlib

    for name in CLI_MODULES:
        importlib.import_module(name)


@dataclass(frozen=True)
class Kind:
    """What a server of one kind imports, how its clients' environment reads to an import, and what its
    child sets itself after the fork."""

    preload: Callable[[], None]
    defaults: Callable[[dict[str, str]], dict[str, str]]
    in_child: Callable[[dict[str, str]], None]


KINDS = {
    "worker": Kind(preload, _worker_defaults, apply_threads),
    "cli": Kind(preload_cli, dict, lambda env: None),
}


def _note(event: str, **fields: object) -> None:
    """One JSON line in the server's log (``forkserver.log`` or ``cliserver.log`` beside its socket): what it
    did, for tests."""
    print(json.dumps({"event": event, **fields}), flush=True)


def _device(argv: list[str]) -> str:
    """The device of a worker's spec (torchrun's too: ``--module inference.worker SPEC``); "cpu" for the
    tests' other programs, which run on the CPU."""
    if argv[-2:-1] != ["inference.worker"]:
        return "cpu"
    try:
        spec = json.loads(Path(argv[-1]).read_text(encoding="utf-8"))
        return str(spec["inference"]["device"])
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        # The worker itself names an unreadable spec; a fresh one does it as well as a fork.
        return "unknown"


@dataclass
class Server:
    listener: socket.socket
    settings: dict[str, str]
    selector: selectors.DefaultSelector = field(default_factory=selectors.DefaultSelector)
    #: child pid -> its client's connection; pidfd -> child pid.
    clients: dict[int, socket.socket] = field(default_factory=dict)
    pidfds: dict[int, int] = field(default_factory=dict)
    preloaded: bool = False
    #: What it preloads and serves: ``worker`` (evaluation workers and the programs that import the same)
    #: or ``cli`` (the tests' short evald commands).
    kind: str = "worker"

    def run(self) -> NoReturn:
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        while True:
            for key, _ in self.selector.select():
                if key.data == "accept":
                    conn, _ = self.listener.accept()
                    if not self.preloaded:
                        # At the first request, not at the session's start: a run of tests that starts
                        # no worker does not pay for the imports.
                        KINDS[self.kind].preload()
                        _note("ready", kind=self.kind, settings=self.settings)
                        self.preloaded = True
                    self._serve(conn)
                elif key.data == "child":
                    self._reap(key.fd)
                else:
                    self._client_gone(key.data)

    def _serve(self, conn: socket.socket) -> None:
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while not message.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    raise ConnectionError("request cut short")
                message += more
            request = json.loads(message)
        except (OSError, ValueError):
            conn.close()
            return
        argv, env, cwd = request["argv"], request["env"], request["cwd"]
        reason = self._decline(argv, env)
        if reason is not None or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            _note("declined", argv=argv, reason=reason or "no streams")
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"declined": reason or "no streams"}).encode() + b"\n")
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._child(argv, env, cwd, fds, conn)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.pidfds[pidfd] = pid
        self.clients[pid] = conn
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        self.selector.register(conn, selectors.EVENT_READ, pid)
        _note("forked", argv=argv, pid=pid)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _decline(self, argv: list[str], env: dict[str, str]) -> str | None:
        if _device(argv).startswith("cuda"):
            return "a CUDA job"
        theirs = import_settings(env, self.kind)
        differ = sorted(
            k for k in theirs.keys() | self.settings.keys() if theirs.get(k) != self.settings.get(k)
        )
        if differ:
            return f"{DIFFERENT_ENVIRONMENT}: {', '.join(differ)}"
        return None

    def _child(
        self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int], conn: socket.socket
    ) -> NoReturn:
        code = 1
        try:
            os.setsid()
            self.selector.close()
            self.listener.close()
            for other in self.clients.values():
                other.close()
            for pidfd in self.pidfds:
                os.close(pidfd)
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            os.chdir(cwd)
            if PARENT_PID_ENV in env:
                # The worker ties itself to its parent, now this server; the client is tied to the daemon.
                # torchrun's ranks are tied to torchrun: this process, whose children they are.
                tie = os.getpid() if argv[:2] == TORCHRUN else os.getppid()
                env = {**env, PARENT_PID_ENV: str(tie)}
            os.environ.clear()
            os.environ.update(env)
            KINDS[self.kind].in_child(env)
            if argv[:2] == TORCHRUN:
                _in_torchrun()
            # Named as a fresh one would be (its spec in its command line), so that whoever finds the
            # worker by its command line (a test, `ps`) finds this process too, not only its client.
            setproctitle.setproctitle(" ".join([sys.executable, *argv]))
            if argv[0] == "-u":
                # As python -u: what the rank writes goes out at once (torchrun starts ranks so).
                argv = argv[1:]
                for stream in (sys.stdout, sys.stderr):
                    stream.reconfigure(write_through=True)  # type: ignore[union-attr]
            if argv[0] == "-m":
                module, args = argv[1], argv[2:]
                sys.argv = [module, *args]
                sys.path[0] = cwd
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                script = str(Path(cwd, argv[0]))
                sys.argv = [argv[0], *argv[1:]]
                sys.path[0] = str(Path(script).parent)
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _reap(self, pidfd: int) -> None:
        pid = self.pidfds.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        conn = self.clients.pop(pid, None)
        if conn is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        if os.WIFSIGNALED(status):
            answer = {"signal": os.WTERMSIG(status)}
        else:
            answer = {"exit": os.waitstatus_to_exitcode(status)}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(answer).encode() + b"\n")
        conn.close()

    def _client_gone(self, pid: int) -> None:
        """The client's connection is readable: it sends nothing more, so it closed (killed)."""
        conn = self.clients.pop(pid)
        self.selector.unregister(conn)
        conn.close()
        kill_child(pid)


def kill_child(pid: int) -> None:
    """Kill a forked child, its process group and every process under it. By pid as well: a child not yet
    past its ``setsid`` has no group of its own, and a client killed that early (its daemon killed as the
    worker started) once left a worker that nobody could stop, which then wrote a result for a job the next
    daemon had to redo. Its tree too, stopped first (``stop_tree``, as the daemon stops a worker): a forked
    torchrun's ranks run in sessions of their own, and outlived a job killed for its timeout."""
    from daemon.running.workers import stop_tree

    try:
        child: psutil.Process | None = psutil.Process(pid)
    except psutil.NoSuchProcess:
        child = None
    stopped = stop_tree(child, [])
    for send in (os.kill, os.killpg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pid, signal.SIGKILL)
    for process in stopped:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def serve(listening_fd: int, kind: str = "worker") -> NoReturn:
    """Serve on the socket the session bound and listens on (clients queue while the imports run)."""
    from inference.lifeline import die_with_parent

    die_with_parent()
    listener = socket.socket(fileno=listening_fd)
    Server(listener, import_settings(dict(os.environ), kind), kind=kind).run()


@dataclass
class ServerProcess:
    """One server of the session: its process, the shim that asks it, its log."""

    process: subprocess.Popen[bytes]
    shim: Path
    log: Path

    def counts(self) -> tuple[int, Counter[str]]:
        """How many processes it forked, and its reasons for declining the others."""
        forked, declined = 0, Counter[str]()
        with contextlib.suppress(OSError):
            for line in self.log.read_text().splitlines():
                note = json.loads(line) if line.startswith("{") else {}
                forked += note.get("event") == "forked"
                if note.get("event") == "declined":
                    declined[str(note.get("reason"))] += 1
        return forked, declined


@dataclass
class Session:
    workers: ServerProcess
    cli: ServerProcess

    @property
    def shim(self) -> Path:
        """The workers' shim (``[inference] python``)."""
        return self.workers.shim

    def summary(self) -> str:
        """How many workers and commands were forked and why the others were declined (a rise in these
        shows a suite that slowed down for a new variable in the tests' environment)."""
        parts = []
        for what, server in (("workers", self.workers), ("evald commands", self.cli)):
            forked, declined = server.counts()
            why = "; ".join(f"{n} × {reason}" for reason, n in declined.most_common())
            parts.append(
                f"{forked} {what} forked, {sum(declined.values())} declined" + (f" ({why})" if why else "")
            )
        return "fork server: " + "; ".join(parts)

    def close(self) -> None:
        for server in (self.workers, self.cli):
            server.process.kill()
            server.process.wait()


def worker_python() -> str:
    """The interpreter a test runs ``-m inference.worker`` with: the session's shim, else the real one."""
    return os.environ.get(PYTHON_OVERRIDE_ENV) or sys.executable


def cli_python() -> str:
    """The interpreter a test runs ``-m daemon COMMAND`` with: the session's CLI shim, else the real one."""
    return os.environ.get(CLI_PYTHON_ENV) or sys.executable


def worker_like_environment(environ: dict[str, str]) -> dict[str, str]:
    """The session's environment as a daemon passes it to a worker (its allow-list): the server's."""
    from daemon.running.environment import needed

    env = {name: value for name, value in environ.items() if needed(name)}
    env.setdefault("DS_ACCELERATOR", "cpu")
    return env


def start_session(folder: Path) -> Session | None:
    """Start the session's two servers under ``folder`` (``workers``: ``bin/python``; ``cli``: ``bin/evald-
    python``); None when switched off."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bin").mkdir(exist_ok=True)
    # The workers' server has the environment a daemon gives its workers; the CLI's, the tests' own (the
    # environment the tests' evald calls come with).
    workers = _start_server(folder, "fork", "worker", worker_like_environment(dict(os.environ)), "python")
    cli = _start_server(folder, "cli", "cli", dict(os.environ), "evald-python")
    return Session(workers, cli)


def _start_server(folder: Path, name: str, kind: str, env: dict[str, str], shim_name: str) -> ServerProcess:
    socket_path = folder / f"{name}.sock"
    env = {**env, PARENT_PID_ENV: str(os.getpid())}
    # Started from the repository's root: ``-m tests.forkserver`` finds this module without PYTHONPATH, which
    # would differ from the workers' environment.
    repo = Path(__file__).resolve().parent.parent
    # Bound and listening before the server starts: a client that comes first waits in the queue.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(64)
    log_path = folder / f"{name}server.log"
    with listener, log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.forkserver", str(listener.fileno()), kind],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=repo,
            pass_fds=(listener.fileno(),),
        )
    shim = folder / "bin" / shim_name
    shim.write_text(
        f"#!{sys.executable} -IS\n"
        "import sys\n"
        f"sys.path.insert(0, {str(repo)!r})\n"
        "from tests.fork_client import main\n"
        f"main({sys.executable!r}, {str(socket_path)!r}, {kind!r})\n",
        encoding="utf-8",
    )
    shim.chmod(0o755)
    return ServerProcess(process, shim, log_path)


if __name__ == "__main__":
    serve(int(sys.argv[1]), *sys.argv[2:3])
