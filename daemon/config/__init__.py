"""The TOML config, typed and validated once at load: one module per section, composed by ``model``.

:func:`load_config` (in ``loader``) reads the file, overlays ``EVALD_<SECTION>_<FIELD>`` variables and
reports every problem with its path in the file. The sections import only :mod:`daemon.config.base`
and each other, never the loader. Each name here is imported from its module when first asked for, so
reading ``[database] url`` alone (:mod:`daemon.config.database_url`, what ``evald results`` reads) costs
none of the sections' models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from evald.lazy import export

if TYPE_CHECKING:
    from daemon.config.alerts import AlertsConfig, Direction, ThresholdConfig, WebhookConfig
    from daemon.config.base import Section, base_dir, resolve_path
    from daemon.config.daemon import DaemonConfig
    from daemon.config.database import DatabaseConfig
    from daemon.config.document import DEFAULT_CONFIG, ENV_PREFIX, config_path, format_errors
    from daemon.config.errors import SecretError
    from daemon.config.executor import RESERVED_SBATCH, ExecutorConfig, ExecutorKind
    from daemon.config.inference import InferenceConfig, hostfile_slots
    from daemon.config.loader import (
        apply_env,
        env_overrides,
        load_config,
        parse_config,
        parse_executor,
    )
    from daemon.config.model import ENV_SECTIONS, Config
    from daemon.config.object_store import S3Config
    from daemon.config.runs import AdaptiveConfig, Backlog, RunConfig
    from daemon.config.scheduling import (
        Frequency,
        ResourcesConfig,
        SchedulingConfig,
        Thresholds,
        TwoStageConfig,
    )
    from daemon.config.secret import SECRET_PREFIX, Secret, load_secret
    from daemon.config.tasks import TaskConfig
    from daemon.config.trackers import (
        ENDPOINT_PREFIX,
        LIBRARIES,
        TrackerConfig,
        library_missing,
        tracker_problems,
    )
    from daemon.config.web import WebConfig

#: Each name's module, in this package.
_HOMES = {
    "AlertsConfig": "alerts",
    "Direction": "alerts",
    "ThresholdConfig": "alerts",
    "WebhookConfig": "alerts",
    "Section": "base",
    "base_dir": "base",
    "resolve_path": "base",
    "DaemonConfig": "daemon",
    "DatabaseConfig": "database",
    "SecretError": "errors",
    "RESERVED_SBATCH": "executor",
    "ExecutorConfig": "executor",
    "ExecutorKind": "executor",
    "InferenceConfig": "inference",
    "hostfile_slots": "inference",
    "DEFAULT_CONFIG": "document",
    "ENV_PREFIX": "document",
    "apply_env": "loader",
    "config_path": "document",
    "env_overrides": "loader",
    "format_errors": "document",
    "load_config": "loader",
    "parse_config": "loader",
    "parse_executor": "loader",
    "ENV_SECTIONS": "model",
    "Config": "model",
    "S3Config": "object_store",
    "AdaptiveConfig": "runs",
    "Backlog": "runs",
    "RunConfig": "runs",
    "Frequency": "scheduling",
    "ResourcesConfig": "scheduling",
    "SchedulingConfig": "scheduling",
    "Thresholds": "scheduling",
    "TwoStageConfig": "scheduling",
    "SECRET_PREFIX": "secret",
    "Secret": "secret",
    "load_secret": "secret",
    "TaskConfig": "tasks",
    "ENDPOINT_PREFIX": "trackers",
    "LIBRARIES": "trackers",
    "TrackerConfig": "trackers",
    "library_missing": "trackers",
    "tracker_problems": "trackers",
    "WebConfig": "web",
}


def __getattr__(name: str) -> Any:
    """``daemon.config.X``: its module imported on first use (:func:`evald.lazy.export`)."""
    return export(__name__, _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__all__ = [
    "DEFAULT_CONFIG",
    "ENDPOINT_PREFIX",
    "ENV_PREFIX",
    "ENV_SECTIONS",
    "LIBRARIES",
    "RESERVED_SBATCH",
    "SECRET_PREFIX",
    "AdaptiveConfig",
    "AlertsConfig",
    "Backlog",
    "Config",
    "DaemonConfig",
    "DatabaseConfig",
    "Direction",
    "ExecutorConfig",
    "ExecutorKind",
    "Frequency",
    "InferenceConfig",
    "ResourcesConfig",
    "RunConfig",
    "S3Config",
    "SchedulingConfig",
    "Secret",
    "SecretError",
    "Section",
    "TaskConfig",
    "ThresholdConfig",
    "Thresholds",
    "TrackerConfig",
    "TwoStageConfig",
    "WebConfig",
    "WebhookConfig",
    "apply_env",
    "base_dir",
    "config_path",
    "env_overrides",
    "format_errors",
    "hostfile_slots",
    "library_missing",
    "load_config",
    "load_secret",
    "parse_config",
    "parse_executor",
    "resolve_path",
    "tracker_problems",
]
