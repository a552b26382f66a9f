"""One hierarchy: every error :mod:`daemon.errors`'s docstring draws is an ``EvaldError`` where it lives (so
``except EvaldError`` and the CLI's one-line report catch it), keeps the other base that existing
``except`` clauses rely on, and the drawing names no class that is not there."""

from __future__ import annotations

import importlib
import re

import pytest

import daemon.errors
from daemon.errors import EvaldError

#: A line of the drawing: the class, then the module it lives in where it is not daemon.errors.
DRAWN = re.compile(r"[├└]── (\w+)\s*(?:(daemon(?:\.\w+)+):)?")


def drawn() -> list[tuple[str, str]]:
    """(module, class) for each class the docstring's tree names; the module of an indented one is its
    parent's."""
    found: list[tuple[str, str]] = []
    module = "daemon.errors"
    for line in (daemon.errors.__doc__ or "").splitlines():
        match = DRAWN.search(line)
        if match is None:
            continue
        nested = line.index(match.group(0)) > len("    ")
        if match.group(2):
            module = match.group(2)
        elif not nested:
            module = "daemon.errors"
        found.append((module, match.group(1)))
    return found


def test_the_drawing_names_the_errors_of_the_daemon() -> None:
    names = {name for _, name in drawn()}
    assert {"SinkError", "ExecutorUnavailable", "SlurmError", "GpusUnavailable", "RayUnreachable"} <= names
    assert {"ApiError", "ConfigError", "ExecutorMisconfigured", "JobExists"} <= names


@pytest.mark.parametrize(("module", "name"), drawn())
def test_every_drawn_error_is_an_evald_error(module: str, name: str) -> None:
    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, EvaldError), f"{module}.{name}"


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("daemon.running.executors.base", "ExecutorError"),
        ("daemon.running.executors.base", "ExecutorUnavailable"),
        ("daemon.running.executors.slurm_output", "SlurmError"),
    ],
)
def test_the_executor_errors_are_still_runtime_errors(module: str, name: str) -> None:
    """Callers of the executors catch RuntimeError (ray_client's conversion of Ray's errors among them):
    joining the hierarchy does not take them out of it."""
    assert issubclass(getattr(importlib.import_module(module), name), RuntimeError)


def test_the_sink_errors_are_evald_errors() -> None:
    from daemon.delivery.errors import SinkError, SinkGone, SinkRefused, SinkRejected, SinkUnavailable

    for error in (SinkGone, SinkRefused, SinkRejected, SinkUnavailable):
        assert issubclass(error, SinkError) and issubclass(error, EvaldError)
