"""The sandbox against hostile code, for real: each attack runs beside good samples in one job, is contained
with its sample marked, and leaves nothing changed outside and no process behind.

The limits are small (1 CPU second, 256 MiB, 64 processes, 10 MiB files, a 16 MiB tmp) so that a fork bomb
and a 10 GB write are stopped early and cheaply; every hostile program first names its processes with a
token (``prctl(PR_SET_NAME)``, inherited by its children) so the test can look for survivors.
"""

from __future__ import annotations

import ast
import os
import secrets
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from inference.code.grading import SampleResult
from inference.code.judge import Judge
from inference.code.problems import CodeProblem, TestCase
from inference.code.sandbox import Bubblewrap, Limits, SandboxFile, bwrap_argv
from inference.errors import TaskInvalid
from inference.spec import CodeLimits, CodeSpec
from tests.deadlines import Deadline, patient

LIMITS = CodeLimits(cpu_s=1, wall_s=4, memory_mb=256, processes=64, file_mb=10, open_files=64, tmp_mb=16)
SPEC = CodeSpec(limits=LIMITS, parallel=4)
DOUBLE = CodeProblem(
    prompt_id="double",
    prefix="",
    setup="",
    tests=(TestCase("1", stdin="21\n", expected="42\n"), TestCase("2", stdin="5\n", expected="10\n")),
)
GOOD = "print(2 * int(input()))\n"


def named(token: str, body: str) -> str:
    """``body`` after naming this process (and so its children) ``token``."""
    prelude = f"import ctypes\nctypes.CDLL(None).prctl(15, b{token!r}, 0, 0, 0)\n"
    return prelude + textwrap.dedent(body)


def processes_named(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == token:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def judged(judge: Judge, programs: list[str]) -> list[SampleResult]:
    """Each program judged between two good samples, all in one job."""
    submissions = [(DOUBLE, code) for program in programs for code in (GOOD, program)] + [(DOUBLE, GOOD)]
    results = judge.judge(submissions)
    assert all(result.passed for result in results[0::2]), [r.verdict for r in results[0::2]]
    return results[1::2]


@pytest.fixture(scope="module")
def judge() -> Judge:
    judge = Judge("hostile", SPEC)
    judge.check([DOUBLE])
    return judge


def test_good_code_passes_and_a_wrong_answer_is_one(judge: Judge) -> None:
    right, wrong = judged(judge, [GOOD, "print(42)\n"])
    assert right.passed
    assert (wrong.verdict, wrong.tests_passed, wrong.counts) == (
        "wrong_answer",
        1,
        {"passed": 1, "wrong_answer": 1},
    )
    failure = wrong.first_failure
    assert failure is not None and (failure.output, failure.expected) == ("42\n", "10\n")


def test_runaway_programs_are_stopped_by_their_limits(judge: Judge) -> None:
    token = f"h7{secrets.token_hex(5)}"
    fork_bomb = named(
        token,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
    )
    spin = named(token, "while True:\n    pass\n")
    sleeper = named(token, "import time\ntime.sleep(60)\n")
    allocation = named(token, "block = bytearray(20 * 2**30)\n")
    big_file = named(
        token,
        """
        with open("/tmp/big", "wb") as f:
            for _ in range(10 * 1024):
                f.write(b"\\0" * 2**20)
        """,
    )
    many_files = named(
        token,
        """
        for n in range(1000):
            with open(f"/tmp/part{n}", "wb") as f:
                f.write(b"\\0" * 5 * 2**20)
        """,
    )
    flood = named(token, "import sys\nwhile True:\n    sys.stdout.write('x' * 2**20)\n")
    bound = Deadline(60)
    results = judged(judge, [fork_bomb, spin, sleeper, allocation, big_file, many_files, flood])
    verdicts = [result.verdict for result in results]
    assert verdicts == [
        "timeout",
        "timeout",
        "timeout",
        "memory",
        "runtime_error",
        "runtime_error",
        "runtime_error",
    ]
    assert "File too large" in results[4].tests[0].output
    assert "No space left on device" in results[5].tests[0].output
    assert "File too large" in results[6].tests[0].output
    assert len(results[6].tests[0].output) < 10_000
    assert processes_named(token) == []
    # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
    assert not bound.expired(), f"took {bound.waited():.1f} s"


def test_the_host_is_out_of_reach(judge: Judge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = f"secret-{secrets.token_hex(8)}"
    monkeypatch.setenv("EVALD_TEST_SECRET", secret)
    config = tmp_path / "evald.toml"
    config.write_text(f'[database]\nurl = "postgresql://evald:{secret}@127.0.0.1/evald"\n')
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    tmp_path.chmod(0o755)  # readable by anyone: only the sandbox keeps it out of reach
    config.chmod(0o644)
    token = f"h7{secrets.token_hex(5)}"
    attacks = {
        "environment": """
            for path in ("/proc/1/environ", "/proc/self/environ"):
                pairs = open(path, "rb").read().split(b"\\0")
                print(sorted(pair.split(b"=")[0].decode() for pair in pairs if pair))
            """,
        "config": f"print(open({str(config)!r}).read())",
        "ssh": "import os\nprint(os.listdir(os.path.expanduser('~/.ssh')), os.listdir('/root/.ssh'))",
        "database": "import socket\nsocket.create_connection(('127.0.0.1', 5432), timeout=2)",
        "network": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)",
        "delete": f"import shutil\nshutil.rmtree({str(victim)!r})",
        "delete_system": "import os\nos.remove('/usr/bin/python3')",
        "kill_parent": """
            import contextlib, os, signal
            os.kill(os.getppid(), signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):  # nothing else it may signal
                os.kill(-1, signal.SIGKILL)
            print(2 * int(input()))
            """,
        "daemon": """
            import os, sys, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(120)
                os._exit(0)
            print(2 * int(input()))
            """,
    }
    results = dict(
        zip(attacks, judged(judge, [named(token, body) for body in attacks.values()]), strict=True)
    )
    outputs = "\n".join(test.output for result in results.values() for test in result.tests)
    assert secret not in outputs
    seen = results["environment"].tests[0].output.splitlines()
    # bwrap's PID 1 has only what the worker gave it, the program only what bwrap set.
    assert ast.literal_eval(seen[0]) == ["LANG", "PATH"]
    assert set(ast.literal_eval(seen[1])) <= {"HOME", "LANG", "PATH", "PWD", "SHLVL", "_"}
    assert results["config"].verdict == "runtime_error"
    assert "FileNotFoundError" in results["config"].tests[0].output
    assert "FileNotFoundError" in results["ssh"].tests[0].output
    assert "ConnectionRefusedError" in results["database"].tests[0].output
    assert "Network is unreachable" in results["network"].tests[0].output
    assert "FileNotFoundError" in results["delete"].tests[0].output
    assert "Read-only file system" in results["delete_system"].tests[0].output
    assert results["kill_parent"].passed  # the sandbox's PID 1 ignores it; nothing outside is reachable
    assert results["daemon"].passed  # the test passes, and its daemon dies with the sandbox
    assert (victim / "keep.txt").read_text() == "keep"
    assert Path("/usr/bin/python3").exists()
    assert processes_named(token) == []


def test_the_database_port_is_really_there_to_refuse() -> None:
    # The sandbox's refusal above means something only when the host's PostgreSQL listens.
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
    except OSError:
        pytest.skip("no PostgreSQL on 127.0.0.1:5432 on this host")


def test_a_timeout_kills_the_whole_tree_before_returning() -> None:
    token = f"h7{secrets.token_hex(5)}"
    limits = Limits(cpu_s=5, wall_s=1, memory_mb=256, processes=64, file_mb=10, open_files=64, tmp_mb=16)
    program = named(
        token,
        """
        import os, time
        for _ in range(5):
            if os.fork() == 0:
                os.setsid()
                time.sleep(120)
        time.sleep(120)
        """,
    )
    files = (SandboxFile("main.py", program.encode()),)
    execution = Bubblewrap().run(["/usr/bin/python3", "-I", "{files}/main.py"], files, b"", limits)
    assert execution.timed_out
    assert processes_named(token) == []


def test_the_command_line_shows_only_what_the_interpreter_needs() -> None:
    limits = Limits(cpu_s=1, wall_s=1, memory_mb=256, processes=64, file_mb=10, open_files=64, tmp_mb=16)
    line = bwrap_argv(["/usr/bin/python3"], [(SandboxFile("main.py", b""), 7)], limits)
    binds = [line[i + 1] for i, arg in enumerate(line) if arg in ("--bind", "--ro-bind", "--dev-bind")]
    assert binds == ["/usr"] + [f"/{name}" for name in ("lib32", "libx32") if Path(f"/{name}").is_dir()]
    assert "--bind" not in line and "--share-net" not in line
    assert {"--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--clearenv"} <= set(
        line
    )
    # /tmp is mounted inside, bounded in size and in inodes (bwrap's --tmpfs cannot bound inodes).
    script = line[line.index("-c") + 1]
    assert f"size={16 << 20},nr_inodes={16 * 1024}," in script and " tmp /tmp" in script
    assert "--tmpfs" not in line


REFUSAL = """
import sys
open("/proc/sys/user/max_user_namespaces", "w").write("0")
from inference.code.judge import Judge
from inference.spec import CodeSpec
try:
    Judge("t", CodeSpec()).check()
except Exception as exc:
    print(type(exc).__name__, exc)
judge = Judge("t", CodeSpec(sandbox="none"))
judge.check()
from inference.code.problems import CodeProblem, TestCase
problem = CodeProblem("p", "", "", (TestCase("1", stdin="2\\n", expected="4\\n"),))
print("none:", judge.judge([(problem, "print(2 * int(input()))")])[0].verdict)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="maps a user namespace by hand, which needs root")
def test_without_user_namespaces_the_task_refuses_unless_told_none() -> None:
    # A user namespace of our own in which no further one may be made: bwrap cannot start there.
    started = subprocess.Popen(
        ["unshare", "--user", "sh", "-c", 'read go; exec "$0" -c "$1"', sys.executable, REFUSAL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert started.stdin is not None
    ours = Path("/proc/self/ns/user").readlink()
    deadline = Deadline(10)
    while Path(f"/proc/{started.pid}/ns/user").readlink() == ours and not deadline.expired():
        time.sleep(0.01)
    for name in ("uid_map", "gid_map"):
        Path(f"/proc/{started.pid}/{name}").write_text("0 0 65536\n")
    output, _ = started.communicate("go\n", timeout=patient(60))
    assert f"{TaskInvalid.__name__} task 't': bwrap cannot start a sandbox here" in output, output
    assert "user namespaces" in output and "sandbox = 'none'" in output
    assert "none: passed" in output
