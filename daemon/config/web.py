"""``[web]``: ``evald serve``'s address, its bearer token and what ``/metrics`` lists."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from daemon.config.base import Section
from daemon.errors import ConfigError


class WebConfig(Section):
    """``evald serve``: the read-only HTTP API, dashboard and ``/metrics``."""

    #: Loopback by default: put a reverse proxy (TLS) in front to reach it from elsewhere.
    host: str = Field(default="127.0.0.1", min_length=1)
    #: The TCP port ``evald serve`` listens on (``evald serve --port`` overrides it).
    port: int = Field(default=8321, ge=1, le=65535)
    #: When set, every request must carry ``Authorization: Bearer <token>``, the token read from this
    #: environment variable at start (never from the file, never logged).
    token_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: Serve a non-loopback ``host`` without a token anyway (prompts, responses and paths open to whoever
    #: reaches the port); ``evald serve --insecure-no-token`` is the same for one start.
    allow_open: bool = False
    #: ``/metrics`` lists the configured runs and any other whose newest result is at most this old, so
    #: the ``run`` label does not grow with every run the database keeps; 0: configured runs only.
    metrics_window_secs: float = Field(default=7 * 86400.0, ge=0, allow_inf_nan=False)

    def token(self, environ: Mapping[str, str]) -> str | None:
        """The bearer token, or None when none is required; a named but unset variable is an error."""
        if self.token_env is None:
            return None
        value = environ.get(self.token_env, "").strip()
        if not value:
            raise ConfigError(
                "web.token_env",
                [f"environment variable {self.token_env} is not set or empty (set it, or remove token_env)"],
            )
        return value
