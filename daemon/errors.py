"""Daemon errors: each one is reported as a single line and a non-zero exit, never a traceback.

Hierarchy (one root, :class:`evald.errors.EvaldError`, re-exported here; a package's own errors are in its
``errors.py`` or beside the code that raises them, as named here)::

    EvaldError                 evald.errors: the root, shared with inference.errors and storage.errors
    ├── ConfigError            the config file is missing, not TOML, or has bad fields (all are listed)
    ├── JobSetupError          a job could not be handed to a worker (its files could not be written)
    ├── SmoothingError         a smoothing spec (``ema:0.6``, ``window:5``) is malformed (also a ValueError)
    ├── SecretError            daemon.config.errors: a webhook secret that cannot be loaded or parsed
    ├── DeliveryError          daemon.delivery.errors: what a person sees of delivery (SignatureInvalid)
    │   └── AttachFileError    daemon.delivery.sinks.mlflow_attach: a run id file that holds no run id
    ├── SinkError              daemon.delivery.errors: a delivery that did not happen; the relay records it
    │                          and decides (SinkUnavailable, SinkRefused, SinkRejected, SinkGone)
    ├── ExecutorError          daemon.running.executors.base: a job the executor cannot take as it is
    │   │                      (also a RuntimeError)
    │   └── ExecutorMisconfigured   the config asks what the cluster does not have
    ├── ExecutorUnavailable    daemon.running.executors.base: the executor cannot answer now (also a
    │                          RuntimeError)
    ├── SlurmError             daemon.running.executors.slurm_output: a Slurm command failed (also a
    │   │                      RuntimeError)
    │   ├── SlurmUnreachable   slurmctld does not answer
    │   ├── SlurmMissing       the Slurm commands are not there
    │   └── SubmitRejected     sbatch refused the job
    ├── RayUnreachable         daemon.running.executors.ray_client: the Ray cluster does not answer
    ├── RayRefused             daemon.running.executors.ray_client: the Jobs API refused a request
    │   └── JobExists
    ├── IllegalTransition      daemon.running.attempt: an attempt moved where its stages do not lead (a bug)
    ├── GpusUnavailable        daemon.scheduling.resources: NVML could not be asked
    ├── StoreError             daemon.watching.objects: an object store's answer, classified
    │   ├── StoreUnavailable   no answer, a server error or throttling: tried again later
    │   ├── StoreRefused       credentials, permissions or the bucket refused: the run waits for a fix
    │   ├── ObjectGone         deleted after it was listed
    │   └── ObjectChanged      replaced after it was listed (its ETag no longer matches)
    ├── CopyFailed             daemon.watching.object_cache: a checkpoint could not be downloaded
    ├── PlotFormatError        daemon.analysis.plot: ``--out``'s suffix names no format (a usage error)
    ├── ExportError            daemon.export.lm_eval: results that cannot be written as lm-eval writes them
    ├── ApiError               daemon.web.params: an HTTP answer other than 200, with its status
    └── ValueRefused           daemon.filter_values: a filter value refused (an argparse error or a 400)

Errors from :mod:`storage` (``StorageError``) and :mod:`inference` (``InferenceError``, ``RewardFailed``)
derive from the same root in their own ``errors.py`` (neither package imports the daemon). One class is
left out: ``daemon.running.executors.ray_driver.Ended``, which runs on the Ray cluster importing nothing
but ``ray`` and the standard library (tests/test_error_hierarchy.py names it with that reason).
"""

from evald.errors import EvaldError


class ConfigError(EvaldError):
    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


class JobSetupError(EvaldError):
    pass


class SmoothingError(EvaldError, ValueError):
    pass


__all__ = ["ConfigError", "EvaldError", "JobSetupError", "SmoothingError"]
