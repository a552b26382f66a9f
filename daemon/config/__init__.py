"""The TOML config, typed and validated once at load: one module per section, composed by ``model``.

:func:`load_config` (in ``loader``) reads the file, overlays ``EVALD_<SECTION>_<FIELD>`` variables and
reports every problem with its path in the file. The sections import only :mod:`daemon.config.base`
and each other, never the loader.
"""

from daemon.config.alerts import AlertsConfig, Direction, ThresholdConfig, WebhookConfig
from daemon.config.base import Section, base_dir, resolve_path
from daemon.config.daemon import DaemonConfig
from daemon.config.database import DatabaseConfig
from daemon.config.errors import SecretError
from daemon.config.executor import RESERVED_SBATCH, ExecutorConfig, ExecutorKind
from daemon.config.inference import InferenceConfig, hostfile_slots
from daemon.config.loader import (
    DEFAULT_CONFIG,
    ENV_PREFIX,
    apply_env,
    config_path,
    env_overrides,
    format_errors,
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
