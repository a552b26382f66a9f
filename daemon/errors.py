"""Daemon errors: each one is reported as a single line and a non-zero exit, never a traceback.

Hierarchy::

    EvaldError
    ├── ConfigError        the config file is missing, not TOML, or has bad fields (all are listed)
    ├── JobSetupError      a job could not be handed to a worker (its files could not be written)
    └── SmoothingError     a smoothing spec (``ema:0.6``, ``window:5``) is malformed (also a ValueError)

Errors from :mod:`storage` (``StorageError``) and :mod:`inference` (``InferenceError``) keep their own
hierarchies; the CLI reports them the same way.
"""


class EvaldError(Exception):
    """Base of the daemon's own errors."""


class ConfigError(EvaldError):
    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class JobSetupError(EvaldError):
    pass


class SmoothingError(EvaldError, ValueError):
    pass
