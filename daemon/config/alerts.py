"""``[alerts]`` and ``[[webhooks]]``: when a result is an alert, and where alerts are sent."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from daemon.anomaly.settings import Settings
from daemon.config.base import Section, resolve_path
from daemon.config.errors import SecretError
from daemon.config.secret import load_secret

Direction = Literal["higher", "lower", "none"]


class ThresholdConfig(Section):
    """An absolute bound on a metric: crossing it is a critical alert whatever the series did before."""

    #: A result below this fires the alert; unset: no lower bound.
    min: float | None = None
    #: A result above this fires the alert; unset: no upper bound.
    max: float | None = None


class AlertsConfig(Section):
    """When a result is an alert: the anomaly detectors' settings, absolute thresholds, and the best
    checkpoint."""

    #: A repeat of a firing alert within this long updates it without sending it again.
    cooldown_secs: float = Field(default=3600.0, ge=0)
    #: Where a status JSON per run is written (best checkpoint, firing alerts, where to roll back to).
    feedback_dir: Path | None = None
    #: The metric that picks a run's best checkpoint.
    best_metric: str = "accuracy"
    #: Which way is better, per metric, overriding the registry's (``none``: any jump counts).
    directions: dict[str, Direction] = Field(default_factory=dict)
    #: Per metric name: an absolute bound whose crossing is a critical alert (see
    #: ``[alerts.thresholds.NAME]``).
    thresholds: dict[str, ThresholdConfig] = Field(default_factory=dict)
    #: Detector settings (``daemon.anomaly.settings.Settings``): window, z_threshold, noise_sigmas, ...
    detectors: dict[str, float] = Field(default_factory=dict)
    #: Links sent with every alert, e.g. ``{ dashboard = "https://grafana/d/evald" }``.
    links: dict[str, str] = Field(default_factory=dict)

    @field_validator("feedback_dir")
    @classmethod
    def _feedback_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else resolve_path(value, info)

    @field_validator("links")
    @classmethod
    def _links(cls, value: dict[str, str]) -> dict[str, str]:
        empty = sorted(name for name, url in value.items() if not name or not url.strip())
        if empty:
            raise ValueError(f"empty link {', '.join(empty)}: give each a URL")
        return value

    @model_validator(mode="after")
    def _ranges(self) -> AlertsConfig:
        problems = [
            f"thresholds.{m}: min > max"
            for m, t in self.thresholds.items()
            if t.min is not None and t.max is not None and t.min > t.max
        ]
        s = self.settings()
        if s.window < 2 or s.min_history < 2:
            problems.append("detectors: window and min_history must be at least 2")
        if not 0 < s.ewma_lambda <= 1:
            problems.append("detectors: ewma_lambda must be in (0, 1]")
        for name in ("z_threshold", "noise_sigmas", "cusum_h", "drop_sigmas", "length_ratio"):
            if getattr(s, name) <= 0:
                problems.append(f"detectors: {name} must be positive")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @field_validator("detectors")
    @classmethod
    def _detectors(cls, value: dict[str, float]) -> dict[str, float]:
        known = set(Settings.__dataclass_fields__)
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(
                f"unknown detector setting {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        return value

    def settings(self) -> Settings:
        defaults = Settings()
        return Settings(**{k: type(getattr(defaults, k))(v) for k, v in self.detectors.items()})


class WebhookConfig(Section):
    """An HTTP endpoint every alert is POSTed to (firing and resolved), signed, retried until delivered."""

    #: The endpoint's name in its delivery logs, its queue of messages and ``evald webhook test NAME``.
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    #: Where alerts are POSTed (http or https); never logged, as a Slack incoming-webhook URL is a secret.
    url: str = Field(pattern=r"^https?://\S+$")
    #: The body: ``generic`` (evald's JSON), ``slack`` (an incoming-webhook message) or ``alertmanager``
    #: (what Alertmanager's webhook sends, for receivers written for it).
    format: Literal["generic", "slack", "alertmanager"] = "generic"
    #: The signing secret (Standard Webhooks, ``whsec_...``), read from this environment variable. Give
    #: it or ``secret_file``, not both; neither: requests go unsigned.
    secret_env: str | None = None
    #: Or a file holding the signing secret, readable by its owner only (one open to group or others is
    #: refused).
    secret_file: Path | None = None
    #: Seconds to connect to the receiver; past it the try fails and is retried later.
    connect_timeout_secs: float = Field(default=2.0, gt=0)
    #: The whole request, connect to last byte: a receiver that hangs is cut off here.
    timeout_secs: float = Field(default=5.0, gt=0)
    #: Alerts below this severity are not sent to this endpoint (they are still stored and shown).
    min_severity: Literal["info", "warning", "critical"] = "warning"
    #: Retries back off exponentially (with jitter) up to this; a message is retried until delivered.
    max_backoff_secs: float = Field(default=300.0, gt=0)

    @field_validator("secret_file")
    @classmethod
    def _secret_file(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return None if value is None else resolve_path(value, info)

    @model_validator(mode="after")
    def _secret_usable(self, info: ValidationInfo) -> WebhookConfig:
        """The secret read as ``evald run`` reads it, so ``config check`` and a reload refuse what a start
        would, in the same words. One that is not there at all (a variable or credential file only the
        daemon's unit provides) is left to the start: see :meth:`secret_absent`."""
        environ = (info.context or {}).get("environ")
        unsigned = self.secret_env is None and self.secret_file is None
        if unsigned or environ is None or self.secret_absent(environ) is not None:
            return self
        try:
            load_secret(env=self.secret_env, file=self.secret_file, environ=environ)
        except SecretError as exc:
            raise ValueError(str(exc)) from None
        return self

    def secret_absent(self, environ: Mapping[str, str]) -> str | None:
        """Why this host cannot read the secret at all (its variable unset, its file missing), else None."""
        if self.secret_env is not None and self.secret_file is None and self.secret_env not in environ:
            return f"environment variable {self.secret_env} is not set here"
        if self.secret_file is not None and self.secret_env is None and not os.path.lexists(self.secret_file):
            return f"secret file {self.secret_file} does not exist here"
        return None
