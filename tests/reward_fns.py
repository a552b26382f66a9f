"""Reward functions for the tests, as a user would write them in a module of their own."""

from __future__ import annotations

import os
import time

NOT_CALLABLE = 3


def length_penalty(prompt: str, response: str, reference: str) -> float:
    """1 for a correct-looking answer, minus a little per character: a typical shaped reward."""
    return (1.0 if reference in response else 0.0) - 0.01 * len(response)


def poisoned(prompt: str, response: str, reference: str) -> object:
    """Well-behaved except for the prompts that ask for trouble (the poisoned-job test's dataset)."""
    if prompt.startswith("raise"):
        raise ValueError(f"cannot score {prompt!r}")
    if prompt.startswith("hang"):
        time.sleep(3600)
    if prompt.startswith("text"):
        return "high"
    if prompt.startswith("nan"):
        return float("nan")
    if prompt.startswith("crash"):
        os._exit(9)
    return 1.0 if reference in response else 0.0


def always_raises(prompt: str, response: str, reference: str) -> float:
    raise RuntimeError("broken reward")
