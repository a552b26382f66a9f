"""Watching the checkpoint folders.

File events and polling (:mod:`.watcher`), which folders could be checkpoints (:mod:`.folders`), discovery
of new checkpoints (:mod:`.discovery`, writing through :mod:`.ledger`) and the readiness verdict
(:mod:`.readiness`).
"""

from daemon.watching.discovery import Discovery
from daemon.watching.folders import candidate_dirs, is_container, top_level_child
from daemon.watching.runs import WatchedRun

__all__ = ["Discovery", "WatchedRun", "candidate_dirs", "is_container", "top_level_child"]
