"""Running one untrusted command: in a bubblewrap sandbox, or (only when configured) bare, with rlimits.

The bubblewrap sandbox (:class:`Bubblewrap`) gives the command:

- no network (a new network namespace with only loopback, so 127.0.0.1 is its own);
- a read-only view of ``/usr`` (and the ``/bin``, ``/lib`` links into it) plus the interpreter's or
  compiler's own prefix when it lives elsewhere: no ``/home``, ``/root``, ``/etc``, no daemon state;
- its files, copied in read-only under ``/sandbox``, and a private tmpfs at ``/tmp`` bounded in size and
  in inodes (``nr_inodes``: a program making 200,000 empty folders would otherwise pin ~150 MB of
  kernel memory that no size limit counts); the root and ``/dev`` are remounted read-only, so nothing
  else can be written;
- an empty environment (bwrap itself starts with none, so even ``/proc/1/environ`` is empty), no
  inherited descriptors, a new session (no terminal to push input into);
- rlimits (CPU seconds, address space, processes, file size, open files) set by ``prlimit`` inside the
  sandbox, so that the process count is counted in the sandbox's own user namespace: parallel sandboxes
  do not share one budget, and the worker's threads do not count against it;
- an unprivileged user: a root worker starts bwrap as ``nobody``, because the kernel never applies
  RLIMIT_NPROC to root (a fork bomb would not be stopped);
- a status it cannot forge: whether the sandbox started is read from bwrap's ``--json-status-fd``
  (an ``exit-code`` document only once bwrap's setup has finished), which stays outside the sandbox;
  what anything inside writes, on any descriptor, is the program's output and never a sandbox failure;
- a wall clock: past it the process group is killed. bwrap runs with ``--unshare-pid`` and
  ``--die-with-parent``, so the sandbox's PID 1 dying takes every descendant with it, a ``setsid``
  daemon included; the wait only returns once that PID 1 is gone.

bwrap 0.8's ``--tmpfs`` takes a size and permissions but no inode count, so ``/tmp`` is mounted by the
sandbox itself: bwrap gives the command ``CAP_SYS_ADMIN`` (and ``CAP_SETPCAP``) in its own user namespace
only, ``unshare --mount`` makes a mount namespace that namespace owns, ``mount -t tmpfs -o
size=,nr_inodes=`` mounts ``/tmp``, and ``setpriv`` drops every capability (bounding set, inheritable,
ambient; ``no_new_privs`` is already set) before the model's code runs.

No cgroup is used (none is delegated to the worker), so memory is bounded by address space and the tmpfs
size, not by resident memory.

:class:`Bare` runs the same command as a plain subprocess with the same rlimits, a new session and the
same kill: no isolation from the host at all. It is the benchmark's baseline, and what ``sandbox =
"none"`` asks for explicitly; the worker never falls back to it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from inference.code.status import await_gone, child_pid, started
from inference.errors import TaskInvalid

#: Placeholders a runner writes in its command line: where its files are (read-only) and the writable tmp.
FILES = "{files}"
TMP = "{tmp}"
#: Placeholders for the harness's descriptors (see :class:`Channel`): what it reads first, what it reports on.
CHANNEL_IN = "{channel_in}"
CHANNEL_OUT = "{channel_out}"

#: The unprivileged user a root worker runs sandboxes as (Debian's ``nobody``).
NOBODY = 65534

#: ``PATH`` inside the sandbox, and where tools are looked up for it (not the worker's virtualenv).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"

#: Top-level links into /usr on a merged-/usr system; each one that is a directory is bound read-only.
_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(frozen=True)
class Limits:
    """Limits of one execution (see :class:`inference.spec.CodeLimits` for each one's meaning)."""

    cpu_s: float
    wall_s: float
    memory_mb: int
    processes: int
    file_mb: int
    open_files: int
    tmp_mb: int

    @property
    def tmp_inodes(self) -> int:
        """Inodes the ``/tmp`` tmpfs may hold: 1024 per MiB (an inode and its dentry take under 1 KiB of
        kernel memory, so a full ``/tmp`` pins no more kernel memory than its size), 1024 at least."""
        return max(1024, self.tmp_mb * 1024)


@dataclass(frozen=True)
class Channel:
    """Two descriptors for a trusted harness that runs inside the sandbox before the program's code:
    ``data`` to read (and close) first, and an empty one to report on. They are passed as descriptors,
    never files, arguments or environment, so nothing in them is on any path a program can open."""

    data: bytes


@dataclass(frozen=True)
class SandboxFile:
    name: str
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class Execution:
    """How one command ended. ``returncode`` follows the shell: ``128 + N`` for a process killed by
    signal N (bwrap's PID 1 reports it so); ``timed_out`` when the wall clock killed it."""

    returncode: int
    stdout: bytes
    stderr: bytes
    wall_s: float
    timed_out: bool = False
    #: What was written on the :class:`Channel`'s report descriptor (empty without a channel).
    report: bytes = b""

    @property
    def signal(self) -> int | None:
        return self.returncode - 128 if self.returncode > 128 else None


class Sandbox(ABC):
    """Runs a command with files, stdin and limits; nothing it starts outlives :meth:`run`."""

    name: str

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        files: Sequence[SandboxFile],
        stdin: bytes,
        limits: Limits,
        channel: Channel | None = None,
    ) -> Execution:
        """Run ``argv`` (whose ``{files}``, ``{tmp}``, ``{channel_in}`` and ``{channel_out}`` are filled
        in) to its end or its wall clock."""

    def check(self, limits: Limits) -> None:
        """Run a trivial command; a sandbox that cannot start is :class:`TaskInvalid` saying why."""
        result = self.run(["/bin/sh", "-c", "exit 0"], (), b"", limits)
        if result.returncode != 0 or result.timed_out:
            raise TaskInvalid(self._failure(result))

    def _failure(self, result: Execution) -> str:
        said = result.stderr.decode("utf-8", "replace").strip() or f"exit status {result.returncode}"
        return f"the {self.name} sandbox cannot run a command here: {said}"


def prlimit_argv(limits: Limits, argv: Sequence[str]) -> list[str]:
    """``argv`` under ``prlimit``: soft CPU limit (SIGXCPU) with a hard one a second later (SIGKILL)."""
    cpu = max(1, round(limits.cpu_s))
    return [
        _tool("prlimit"),
        f"--cpu={cpu}:{cpu + 1}",
        f"--as={limits.memory_mb << 20}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_mb << 20}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
        *argv,
    ]


def bwrap_argv(
    argv: Sequence[str],
    files: Sequence[tuple[SandboxFile, int]],
    limits: Limits,
    *,
    readable: Sequence[Path] = (),
    root: Path = Path("/"),
    channel: tuple[int, int] | None = None,
) -> list[str]:
    """The bwrap command line running ``argv`` (already under prlimit), each file read from its
    descriptor into ``/sandbox``; ``readable`` are extra host folders bound read-only (a toolchain
    outside ``/usr``); ``channel`` the harness's descriptors, filled in for ``{channel_in}`` and
    ``{channel_out}``."""
    line = [
        _tool("bwrap"),
        "--unshare-all",
        "--unshare-user",
        # No nested user namespace: inside one the code would be root and could lift its rlimits.
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--clearenv",
        *("--setenv", "PATH", "/usr/bin:/bin"),
        *("--setenv", "HOME", "/tmp"),
        *("--setenv", "LANG", "C.UTF-8"),
        # Only for the mounts of tmp_argv, in the sandbox's own user namespace; dropped before the code.
        *("--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"),
        *("--ro-bind", "/usr", "/usr"),
    ]
    for name in _ROOT_LINKS:
        host = root / name
        if host.is_symlink():
            line += ["--symlink", str(host.readlink()), f"/{name}"]
        elif host.is_dir():
            line += ["--ro-bind", str(host), f"/{name}"]
    for folder in readable:
        line += ["--ro-bind", str(folder), str(folder)]
    line += ["--proc", "/proc", "--dev", "/dev", "--dir", "/tmp", "--dir", "/dev/shm", "--dir", "/sandbox"]
    for file, fd in files:
        line += ["--perms", "0555" if file.executable else "0444", "--ro-bind-data", str(fd)]
        line.append(f"/sandbox/{file.name}")
    line += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/", "--"]
    filled = [_fill(arg, files="/sandbox", tmp="/tmp", channel=channel) for arg in argv]
    return line + tmp_argv(limits, filled)


def tmp_argv(limits: Limits, argv: Sequence[str]) -> list[str]:
    """``argv`` after mounting ``/tmp`` (and ``/dev/shm``) with a size and an inode count, then dropping
    every capability: bwrap's own ``--tmpfs`` cannot bound inodes. The mounts need a mount namespace the
    sandbox's user namespace owns (``--disable-userns`` runs the command in a nested one), hence
    ``unshare``."""
    options = "mode=1777,nosuid,nodev,noexec"
    mount = _tool("mount")
    script = (
        f"{mount} -t tmpfs -o size={limits.tmp_mb << 20},nr_inodes={limits.tmp_inodes},{options} tmp /tmp"
        f" && {mount} -t tmpfs -o size={1 << 20},nr_inodes=64,{options} shm /dev/shm"
        " && cd /tmp && unset OLDPWD"
        f' && exec {_tool("setpriv")} --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- "$@"'
    )
    return [
        _tool("unshare"),
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        script,
        "sh",
        *argv,
    ]


class Bubblewrap(Sandbox):
    name = "bwrap"

    def __init__(self, readable: Sequence[Path] = ()) -> None:
        self.readable = tuple(readable)

    def check(self, limits: Limits) -> None:
        if shutil.which("bwrap", path=SYSTEM_PATH) is None:
            raise TaskInvalid(
                "sandbox = 'bwrap' but bwrap is not installed (/usr/bin/bwrap: Debian's bubblewrap "
                "package); the model's code is never run unsandboxed unless the task says sandbox = 'none'"
            )
        for folder in self.readable:
            if not _readable_by_sandbox(folder):
                raise TaskInvalid(
                    f"the sandbox user cannot read {folder}, where the toolchain lives (a root worker runs "
                    "sandboxes as nobody): set executable to one under /usr, such as /usr/bin/python3"
                )
        super().check(limits)

    def _failure(self, result: Execution) -> str:
        # Only bwrap's own lines: no program's output ever reaches a job's error.
        lines = result.stderr.decode("utf-8", "replace").splitlines()
        said = "; ".join(line for line in lines if line.startswith("bwrap: "))[:2000]
        said = said or f"exit status {result.returncode}"
        return (
            f"bwrap cannot start a sandbox here ({said}): it needs unprivileged user namespaces "
            "(sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone = 1 on older Debian "
            "kernels; no AppArmor rule restricting them) in which it may mount a tmpfs. The model's code "
            "is never run unsandboxed unless the task says sandbox = 'none'"
        )

    def run(
        self,
        argv: Sequence[str],
        files: Sequence[SandboxFile],
        stdin: bytes,
        limits: Limits,
        channel: Channel | None = None,
    ) -> Execution:
        with ExitStack() as stack:
            descriptors = [(file, stack.enter_context(_memfd(file.name, file.data))) for file in files]
            # bwrap writes it from outside the sandbox: nothing the program does reaches it.
            status = stack.enter_context(_memfd("status", b""))
            fds = [fd for _, fd in descriptors]
            ends = None
            if channel is not None:
                ends = (
                    stack.enter_context(_memfd("in", channel.data)),
                    stack.enter_context(_memfd("out", b"")),
                )
                fds += ends
            line = bwrap_argv(
                prlimit_argv(limits, argv), descriptors, limits, readable=self.readable, channel=ends
            )
            line[1:1] = ["--json-status-fd", str(status)]
            result = _execute(line, stdin, limits, pass_fds=[*fds, status], cwd="/", status=status)
            # No exit code from bwrap: its setup failed (it exits 1, and no program ran), or bwrap itself
            # was killed (the OOM killer), which is the execution's failure, not the sandbox's.
            if not result.timed_out and result.returncode <= 128 and not started(_read(status, 1 << 16)):
                raise TaskInvalid(self._failure(result))
            return _reported(result, ends, limits)


class Bare(Sandbox):
    """A plain subprocess with rlimits: for ``sandbox = "none"`` and the benchmark's baseline."""

    name = "none"

    def run(
        self,
        argv: Sequence[str],
        files: Sequence[SandboxFile],
        stdin: bytes,
        limits: Limits,
        channel: Channel | None = None,
    ) -> Execution:
        with tempfile.TemporaryDirectory(prefix="evald-code-") as folder, ExitStack() as stack:
            for file in files:
                path = Path(folder) / file.name
                path.write_bytes(file.data)
                path.chmod(0o555 if file.executable else 0o444)
            if os.geteuid() == 0:
                os.chown(folder, NOBODY, NOBODY)
            ends = None
            if channel is not None:
                ends = (
                    stack.enter_context(_memfd("in", channel.data)),
                    stack.enter_context(_memfd("out", b"")),
                )
            filled = [_fill(arg, files=folder, tmp=folder, channel=ends) for arg in argv]
            result = _execute(
                prlimit_argv(limits, filled), stdin, limits, pass_fds=ends or (), cwd=folder, status=None
            )
            return _reported(result, ends, limits)


def sandbox_for(name: str, readable: Sequence[Path] = ()) -> Sandbox:
    if name == "bwrap":
        return Bubblewrap(readable)
    if name == "none":
        return Bare()
    raise TaskInvalid(f"unknown sandbox {name!r} (known: bwrap, none)")


def _execute(
    line: list[str],
    stdin: bytes,
    limits: Limits,
    *,
    pass_fds: Sequence[int],
    cwd: str,
    status: int | None,
) -> Execution:
    # Descriptors, not pipes: nothing to drain while waiting, and RLIMIT_FSIZE bounds what is written.
    with _memfd("stdin", stdin) as into, _memfd("stdout", b"") as out, _memfd("stderr", b"") as err:
        started = time.perf_counter()
        try:
            process = _start(line, into, out, err, pass_fds, cwd)
        except OSError as exc:
            raise TaskInvalid(f"cannot start {line[0]} for the model's code: {exc}") from exc
        timed_out = False
        try:
            returncode = process.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(process.pid)
            returncode = process.wait()
        except BaseException:
            _kill_group(process.pid)
            process.wait()
            raise
        if status is not None:
            # bwrap returns once its PID 1 reports the command's exit, before that PID 1 has gone (it
            # dies with bwrap, and takes the namespace with it): a ``setsid`` daemon outlives the return
            # by that gap unless the wait covers it too.
            await_gone(child_pid(_read(status, 1 << 16)))
        wall = time.perf_counter() - started
        if returncode < 0:
            returncode = 128 - returncode
        cap = (limits.file_mb << 20) + 1
        return Execution(returncode, _read(out, cap), _read(err, cap), wall, timed_out)


def _reported(result: Execution, ends: tuple[int, int] | None, limits: Limits) -> Execution:
    if ends is None:
        return result
    return dataclasses.replace(result, report=_read(ends[1], (limits.file_mb << 20) + 1))


def _start(
    line: list[str], into: int, out: int, err: int, pass_fds: Sequence[int], cwd: str
) -> subprocess.Popen[bytes]:
    user = NOBODY if os.geteuid() == 0 else None
    return subprocess.Popen(
        line,
        stdin=into,
        stdout=out,
        stderr=err,
        pass_fds=tuple(pass_fds),
        cwd=cwd,
        env={"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
        start_new_session=True,
        user=user,
        group=user,
        extra_groups=[] if user is not None else None,
    )


def _kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@contextmanager
def _memfd(name: str, data: bytes) -> Iterator[int]:
    fd = os.memfd_create(name)
    try:
        if data:
            os.write(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def _read(fd: int, cap: int) -> bytes:
    chunks = []
    offset = 0
    while offset < cap:
        chunk = os.pread(fd, min(1 << 20, cap - offset), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _tool(name: str) -> str:
    found = shutil.which(name, path=SYSTEM_PATH)
    if found is None:
        raise TaskInvalid(f"{name} is not installed (looked in {SYSTEM_PATH}); code tasks need it")
    return found


def _fill(arg: str, *, files: str, tmp: str, channel: tuple[int, int] | None = None) -> str:
    arg = arg.replace(FILES, files).replace(TMP, tmp)
    if channel is not None:
        arg = arg.replace(CHANNEL_IN, str(channel[0])).replace(CHANNEL_OUT, str(channel[1]))
    return arg


def _readable_by_sandbox(folder: Path) -> bool:
    """Whether the sandbox's user can reach ``folder`` (every folder above it searchable by others)."""
    if os.geteuid() != 0:
        return os.access(folder, os.R_OK | os.X_OK)
    for part in (folder, *folder.parents):
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True
