"""What discovery keeps of each watched run between passes: the run, and every folder it still looks at.

Plain data: :class:`RunState` is filled and read by :mod:`daemon.watching.discovery` and
:mod:`daemon.watching.ledger`; a restart builds it again from the database.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from daemon.config import RunConfig
from daemon.watching import refusals
from inference import layouts
from inference.layouts import FileStat, Snapshot


@dataclass(frozen=True)
class WatchedRun:
    config: RunConfig
    run_id: int
    tasks: tuple[str, ...]

    @property
    def settings(self) -> layouts.LayoutSettings:
        return self.config.layout_settings()


@dataclass
class Candidate:
    snapshot: Snapshot
    stable_since: float
    recorded: bool = False
    last_reason: str = ""
    #: When it was first looked at (``stable_since`` restarts with every change).
    seen_since: float = 0.0


@dataclass(frozen=True)
class Evaluated:
    """A checkpoint judged ready by this daemon, with its weight files as they were then: a rescan stats
    them (no read) to notice weights overwritten in place."""

    name: str
    step: int | None
    weights: tuple[FileStat, ...]


@dataclass
class RunState:
    run: WatchedRun
    #: Checkpoints whose fate is settled (ready, invalid, vanished): never looked at again.
    settled: set[str] = field(default_factory=set)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    #: Checkpoints a previous daemon recorded as discovered; the first look after a restart starts their
    #: quiet period afresh.
    recorded: set[str] = field(default_factory=set)
    #: Folders a transient error (EIO, ESTALE, ...) keeps from being read: when it was first met. Looked
    #: at again by every rescan, logged once, refused once it has lasted ``invalid_after_secs``.
    unreadable: dict[str, float] = field(default_factory=dict)
    #: Folders that could be checkpoints and are not taken (yet), with why: logged once when first seen.
    ignored: dict[str, str] = field(default_factory=dict)
    #: Ready shapes of a step waiting for its preferred shape, still being written (waiter → awaited).
    waiting: dict[str, str] = field(default_factory=dict)
    #: Ready checkpoints whose weights each rescan stats, until one changes (said once) or goes.
    evaluated: dict[str, Evaluated] = field(default_factory=dict)
    #: Checkpoints named invalid from evidence a write could still change, with their listing's fingerprint
    #: then (None, for those a restarted daemon finds invalid: taken at its first rescan): one whose files
    #: change since is judged again (a write that stalled past the quiet period and went on), never left
    #: invalid for good. Final verdicts (a name, a FIFO, a link out of the root) are not here.
    invalid: dict[str, int | None] = field(default_factory=dict)
    root_missing_logged: bool = False
    root_unreadable_logged: bool = False

    @cached_property
    def real_root(self) -> str:
        return os.path.realpath(self.run.config.root)

    def forget(self, path: Path) -> None:
        """``path`` is settled: never looked at again."""
        key = str(path)
        self.candidates.pop(key, None)
        self.recorded.discard(key)
        self.unreadable.pop(key, None)
        self.settled.add(key)


def fingerprint(snapshot: Snapshot) -> int:
    """What a folder's listing was (names, sizes, times, types), as one number to compare later."""
    return hash(snapshot.files)


def name(state: RunState, path: Path) -> str:
    """A checkpoint's name is its path under the run root (``_actor/global_step7``)."""
    root = state.run.config.root
    return str(path.relative_to(root)) if path.is_relative_to(root) else path.name


def link_problem(state: RunState, path: Path) -> str | None:
    """Why ``path``, symlinks followed, is not a folder of its own strictly inside the run root."""
    return refusals.link_problem(
        name(state, path), os.path.realpath(path), state.real_root, os.path.realpath(path.parent)
    )


def ignored_key(path: Path) -> str:
    """How a noted folder is keyed, in memory and in the database: its path, escaped when no database
    could store it as it is (a newline, bytes that are not UTF-8)."""
    return refusals.shown(str(path))
