"""Watching the checkpoint folders.

File events and polling (:mod:`.watcher`), which folders could be checkpoints (:mod:`.folders`), discovery
of new checkpoints (:mod:`.discovery`, writing through :mod:`.ledger`) and the readiness verdict
(:mod:`.readiness`). Each name here is imported from its module when first asked for: ``evald status``
reads a run's model (:mod:`.runs`, through the scheduling policy) without discovery's machinery and
logging.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evald.lazy import export

if TYPE_CHECKING:
    from daemon.watching.discovery import Discovery
    from daemon.watching.folders import candidate_dirs, is_container, top_level_child
    from daemon.watching.runs import WatchedRun

#: Each name's module, in this package.
_HOMES = {
    "Discovery": "discovery",
    "candidate_dirs": "folders",
    "is_container": "folders",
    "top_level_child": "folders",
    "WatchedRun": "runs",
}


def __getattr__(name: str) -> Any:
    """``daemon.watching.X``: its module imported on first use (:func:`evald.lazy.export`)."""
    return export(__name__, _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = ["Discovery", "WatchedRun", "candidate_dirs", "is_container", "top_level_child"]
