"""Executors: where a job's worker runs (see :mod:`daemon.running.executors.base`)."""
