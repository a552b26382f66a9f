"""Daemon errors: each one is reported as a single line and a non-zero exit, never a traceback.

Hierarchy (one root for the errors that cross a module: a package's own are in its ``errors.py`` or beside
the code that raises them, as named here)::

    EvaldError
    ├── ConfigError            the config file is missing, not TOML, or has bad fields (all are listed)
    ├── JobSetupError          a job could not be handed to a worker (its files could not be written)
    ├── SmoothingError         a smoothing spec (``ema:0.6``, ``window:5``) is malformed (also a ValueError)
    ├── SecretError            daemon.config.errors: a webhook secret that cannot be loaded or parsed
    ├── DeliveryError          daemon.delivery.errors: what a person sees of delivery (SignatureInvalid)
    ├── SinkError              daemon.delivery.errors: a delivery that did not happen; the relay records it
    │                          and decides (SinkUnavailable, SinkRefused, SinkRejected, SinkGone)
    ├── ExecutorError          daemon.running.executors.base: a job the executor cannot take as it is
    │   │                      (also a RuntimeError)
    │   └── ExecutorMisconfigured   the config asks what the cluster does not have
    ├── ExecutorUnavailable    daemon.running.executors.base: the executor cannot answer now (also a
    │                          RuntimeError)
    ├── SlurmError             daemon.running.executors.slurm_output: a Slurm command failed (also a
    │                          RuntimeError)
    ├── RayUnreachable         daemon.running.executors.ray_client: the Ray cluster does not answer
    ├── RayRefused             daemon.running.executors.ray_client: the Jobs API refused a request
    │   └── JobExists
    ├── GpusUnavailable        daemon.scheduling.resources: NVML could not be asked
    └── ApiError               daemon.web.params: an HTTP answer other than 200, with its status

Errors from :mod:`storage` (``StorageError``) and :mod:`inference` (``InferenceError``) keep their own
hierarchies (neither package imports the daemon); the CLI reports them the same way. A module's private
signal, converted where it is caught (``filter_values.ValueRefused`` into an argparse error or a 400,
``PlotFormatError`` and ``ExportError`` into the CLI's errors), is not part of it.
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
