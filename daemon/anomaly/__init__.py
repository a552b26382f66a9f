"""Anomaly detection over metric series: pure functions, one module per family.

A series is one (run, task, metric)'s points in step order, each with its sample count and standard
error. Every detector looks at the newest point against the ones before it (what the daemon does when a
result is stored) and returns a :class:`Finding` or ``None``; :func:`detect` runs them all. Nothing here
touches the database, the clock or the network.
"""

from daemon.anomaly.detector import detect
from daemon.anomaly.series import Finding, Point
from daemon.anomaly.settings import Settings

__all__ = ["Finding", "Point", "Settings", "detect"]
