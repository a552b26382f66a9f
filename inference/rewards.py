"""Reward functions: the built-in math reward, and the user's ``module:function`` run under a time limit.

A reward function is called as ``fn(prompt, response, reference)`` and returns a number. A user's
function runs in a child process of its own (:class:`RewardProcess`), so that one that hangs can be
stopped after ``timeout_s`` (a thread cannot be) and one that crashes the interpreter costs only that
sample: either way the sample is reported and the child replaced. What it raises, or returns that is
not a finite number, is the sample's error, never the job's.
"""

from __future__ import annotations

import importlib
import math
import multiprocessing
import numbers
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from evald.errors import EvaldError
from inference.errors import TaskInvalid
from inference.grading import grade
from inference.lifeline import die_with

RewardFunction = Callable[[str, str, str], Any]


def math_reward(prompt: str, response: str, reference: str) -> float:
    """1.0 when math-verify grades the response's final answer equal to the reference, else 0.0."""
    return 1.0 if grade(response, reference).correct else 0.0


class RewardFailed(EvaldError):
    """One call of a reward function failed; the message says how."""


def load_reward(name: str) -> RewardFunction:
    """Import ``module:function``; every way it can fail is :class:`TaskInvalid` naming ``name``."""
    module_name, _, attribute = name.partition(":")
    if not module_name or not attribute:
        raise TaskInvalid(f"reward {name!r}: expected 'module:function', e.g. 'my_rewards:score'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TaskInvalid(
            f"reward {name!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    function = module
    for part in attribute.split("."):
        if not hasattr(function, part):
            raise TaskInvalid(f"reward {name!r}: module {module_name!r} has no attribute {attribute!r}")
        function = getattr(function, part)
    if not callable(function):
        raise TaskInvalid(f"reward {name!r}: {attribute!r} is a {type(function).__name__}, not a function")
    reward: RewardFunction = function
    return reward


def as_reward(value: object) -> float:
    """``value`` as a reward; anything but a finite real number is :class:`RewardFailed`."""
    if not isinstance(value, numbers.Real):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise RewardFailed(f"returned {type(value).__name__} {shown}, not a number")
    number = float(value)
    if not math.isfinite(number):
        raise RewardFailed(f"returned {number}, not a finite number")
    return number


#: Seconds a new child may take to start and import the reward's module, apart from the per-call limit.
START_TIMEOUT_S = 120.0


def _serve(name: str, connection: Connection, parent: int) -> None:
    """The child's loop: ``ready`` once the function is imported, then one call per message, each outcome
    sent back as ``(ok, value or message)``."""
    # A call that hangs must not outlive the worker that gave up on it.
    die_with(parent)
    try:
        function = load_reward(name)
    except TaskInvalid as exc:
        connection.send((False, exc.message))
        return
    connection.send((True, "ready"))
    while True:
        try:
            prompt, response, reference = connection.recv()
        except EOFError:
            return
        try:
            outcome: tuple[bool, Any] = (True, as_reward(function(prompt, response, reference)))
        except RewardFailed as exc:
            outcome = (False, str(exc))
        except Exception as exc:
            outcome = (False, f"raised {type(exc).__name__}: {exc}")
        connection.send(outcome)


class RewardProcess:
    """Calls the reward function ``name`` in a child process, at most ``timeout_s`` seconds a call (the
    child's start and import are not counted against it)."""

    def __init__(self, name: str, timeout_s: float, start_timeout_s: float = START_TIMEOUT_S) -> None:
        # Checked here first, so a bad name is the job's error before any child starts.
        load_reward(name)
        self._name = name
        self._timeout_s = timeout_s
        self._start_timeout_s = start_timeout_s
        # spawn, not fork: the parent holds torch's threads, which a forked child would inherit broken.
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._connection: Connection | None = None

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (what a kill -9 or the OOM killer would aim at)."""
        return None if self._process is None else int(self._process.pid)

    def _start(self) -> Connection:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(
            target=_serve, args=(self._name, child, os.getpid()), daemon=True, name="evald-reward"
        )
        self._process.start()
        child.close()
        self._connection = parent
        try:
            ready = parent.poll(self._start_timeout_s)
            started, message = parent.recv() if ready else (False, None)
        except (EOFError, OSError):
            started, message = False, None
        if not started:
            self._stop()
            why = message or f"its process did not start within {self._start_timeout_s:g} s"
            raise RewardFailed(f"could not be started: {why}")
        return parent

    def _stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None

    def __call__(self, prompt: str, response: str, reference: str) -> float:
        connection = self._connection or self._start()
        try:
            connection.send((prompt, response, reference))
            if not connection.poll(self._timeout_s):
                self._stop()
                limit = f"{self._timeout_s:g} s"
                raise RewardFailed(f"took longer than {limit} (reward_timeout_s) and was stopped")
            ok, value = connection.recv()
        except (EOFError, OSError) as exc:
            # The pipe closes a moment before the child is reaped: wait for its exit code.
            self._process.join(timeout=5)
            code = self._process.exitcode
            self._stop()
            raise RewardFailed(f"crashed its process (exit code {code})") from exc
        if not ok:
            raise RewardFailed(value)
        return float(value)

    def __enter__(self) -> RewardProcess:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop()
