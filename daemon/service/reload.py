"""SIGHUP: the config file read again and its parts built, or refused with its reason.

What a reload cannot change under a running daemon (:data:`RESTART_ONLY`) refuses it; a config that does
not load or build is refused too, and the running one stays in force. Swapping the built parts in is the
daemon's (:meth:`daemon.service.daemon.Service._start`).
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from daemon.config import Config
from daemon.delivery.errors import DeliveryError
from daemon.errors import ConfigError, EvaldError
from daemon.service.parts import Parts
from storage.errors import DatabaseUnreachable, StorageError

log = structlog.get_logger("evald.service")

#: Fields a reload cannot change under a running daemon: they name what it is connected to and where its
#: workers write.
RESTART_ONLY = (("database", "url"), ("daemon", "state_dir"))


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """The fields that differ between ``old`` and ``new`` and need a restart to change."""
    changed = []
    for section, field in RESTART_ONLY:
        if getattr(getattr(old, section), field) != getattr(getattr(new, section), field):
            changed.append(f"{section}.{field}")
    return changed


def reloaded(
    read_config: Callable[[], Config], running: Config, assemble: Callable[[Config], Parts]
) -> Parts | None:
    """The parts of the config file as it is now, or ``None`` when it is refused (said in one error line).
    :class:`DatabaseUnreachable` is raised: the reload is then tried again once the database answers."""
    try:
        config = read_config()
        fixed = restart_only_changes(running, config)
        if fixed:
            raise ConfigError("reload", [f"{name}: changed; restart the daemon to apply" for name in fixed])
        return assemble(config)
    except DatabaseUnreachable:
        raise
    except (EvaldError, DeliveryError, StorageError, OSError, ValueError) as exc:
        problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
        log.error("config.reload_refused", problems=problems, kept="the running config")
        return None
