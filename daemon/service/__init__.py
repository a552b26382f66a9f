"""The daemon's service: the main loop that watches, plans, runs and stores until told to stop.

:mod:`.daemon` is the loop (:class:`Service`); :mod:`.connect` opens the database at start, :mod:`.parts`
builds what one config needs, :mod:`.reload` reads the config again on SIGHUP, and :mod:`.recovery` takes
over the jobs of daemons that died; :mod:`.systemd_notifier` tells systemd (``Type=notify``) when the
daemon is ready, alive and stopping.
"""

from daemon.service.connect import open_database
from daemon.service.daemon import Service
from daemon.service.parts import register_runs, resource_probe

__all__ = ["Service", "open_database", "register_runs", "resource_probe"]
