"""Reward functions: the built-in math reward, and a user's function run in a child under a time limit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from inference.errors import TaskInvalid
from inference.rewards import RewardFailed, RewardProcess, as_reward, load_reward, math_reward
from tests.deadlines import Deadline


def test_math_reward_grades_with_math_verify() -> None:
    assert math_reward("1/2 as a decimal?", "so \\boxed{0.5}", "\\frac{1}{2}") == 1.0
    assert math_reward("23+45", "\\boxed{67}", "68") == 0.0


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("tests.reward_fns", r"expected 'module:function'"),
        (":length_penalty", r"expected 'module:function'"),
        ("tests.no_such_module:f", r"cannot import 'tests.no_such_module': ModuleNotFoundError"),
        ("tests.reward_fns:nope", r"module 'tests.reward_fns' has no attribute 'nope'"),
        ("tests.reward_fns:NOT_CALLABLE", r"'NOT_CALLABLE' is a int, not a function"),
    ],
)
def test_a_bad_reward_name_says_what_is_wrong(name: str, message: str) -> None:
    with pytest.raises(TaskInvalid, match=rf"^reward '{name}': {message}"):
        load_reward(name)


def test_as_reward_takes_finite_real_numbers_only() -> None:
    assert as_reward(1) == 1.0
    assert as_reward(True) == 1.0
    assert as_reward(0.25) == 0.25
    for bad, why in ((None, "returned NoneType None"), ("1.0", "returned str '1.0'"), (float("inf"), "inf")):
        with pytest.raises(RewardFailed, match=why):
            as_reward(bad)


def test_reward_process_scores_and_survives_every_failure() -> None:
    with RewardProcess("tests.reward_fns:poisoned", timeout_s=1.0) as reward:
        assert reward("ok", "\\boxed{68}", "68") == 1.0
        with pytest.raises(RewardFailed, match=r"^raised ValueError: cannot score 'raise me'$"):
            reward("raise me", "x", "68")
        with pytest.raises(RewardFailed, match=r"^returned str 'high', not a number$"):
            reward("text", "x", "68")
        with pytest.raises(RewardFailed, match=r"^returned nan, not a finite number$"):
            reward("nan", "x", "68")
        bound = Deadline(5)
        with pytest.raises(
            RewardFailed, match=r"^took longer than 1 s \(reward_timeout_s\) and was stopped$"
        ):
            reward("hang", "x", "68")
        # In seconds of a quiet machine (tests/deadlines.py): a loaded one stretches the bound.
        assert not bound.expired(), f"took {bound.waited():.1f} s"
        with pytest.raises(RewardFailed, match=r"^crashed its process \(exit code 9\)$"):
            reward("crash", "x", "68")
        # A fresh child takes over after a hang or a crash.
        assert reward("ok", "\\boxed{67}", "68") == 0.0
        assert reward("ok", "\\boxed{68}", "68") == 1.0


def test_reward_process_checks_the_name_before_starting() -> None:
    with pytest.raises(TaskInvalid, match="has no attribute 'nope'"):
        RewardProcess("tests.reward_fns:nope", timeout_s=1.0)


def test_a_slow_import_is_not_counted_against_the_call() -> None:
    with RewardProcess("tests.reward_slow:constant", timeout_s=0.5) as reward:
        assert reward("p", "r", "1") == 0.5


def test_a_child_that_died_between_calls_costs_one_sample() -> None:
    with RewardProcess("tests.reward_fns:poisoned", timeout_s=2.0) as reward:
        assert reward("ok", "\\boxed{1}", "1") == 1.0
        # By its pid: the test process may have other children (servers of session fixtures).
        assert reward.pid is not None
        child = psutil.Process(reward.pid)
        # As the kernel's OOM killer would: killed, not reaped (multiprocessing reaps it and reads the code).
        child.kill()
        deadline = Deadline(5)
        while child.status() != psutil.STATUS_ZOMBIE and not deadline.expired():
            time.sleep(0.05)
        with pytest.raises(RewardFailed, match=r"^crashed its process \(exit code -9\)$"):
            reward("ok", "\\boxed{1}", "1")
        assert reward("ok", "\\boxed{1}", "1") == 1.0


def test_a_hung_reward_dies_with_its_worker(tmp_path: Path) -> None:
    # A worker holding a reward stuck in a call is SIGKILLed (the daemon's timeout): the child goes too.
    script = (
        "import sys, os\n"
        "from inference.rewards import RewardProcess\n"
        "reward = RewardProcess('tests.reward_fns:poisoned', timeout_s=3600)\n"
        "print(os.getpid(), flush=True)\n"
        "reward('hang', 'x', '1')\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    assert worker.stdout is not None
    int(worker.stdout.readline())
    deadline = Deadline(30)
    children: list[psutil.Process] = []
    while not deadline.expired() and not children:
        children = psutil.Process(worker.pid).children()
        time.sleep(0.1)
    assert children, "the reward child never started"
    time.sleep(1.0)
    worker.kill()
    worker.wait(10)

    _gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive
